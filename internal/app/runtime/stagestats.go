package runtime

import "cairn/internal/app/dashboard"

var _ dashboard.StageSource = (*observer)(nil)

// StageStats implements dashboard.StageSource for `cairn run`: every stage
// of every sub-topology, in the order of the sub-topologies and their
// stages.
func (o *observer) StageStats() []dashboard.StageStats {
	var out []dashboard.StageStats
	for _, sub := range o.r.SubTopologies() {
		for _, st := range sub.Engine.StageStats() {
			out = append(out, dashboard.StageStats{
				SubTopology: sub.Job.Name, Stage: st.Stage, Keyed: st.Keyed,
				RecordsIn: st.RecordsIn, RecordsOut: st.RecordsOut, DeadLetters: st.DeadLetters,
			})
		}
	}
	return out
}
