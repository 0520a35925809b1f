package group

import (
	"slices"
	"time"

	"cairn/internal/app/runtime"
)

// maxEvents bounds the changes a member remembers.
const maxEvents = 50

// Event is a change of what a member runs, as the member saw it: what it
// gained, lost or released, how long after the change it ran again, and
// what each sub-topology's restore took beside what its checkpoint
// predicted a restore from the store would take. A takeover is an event
// with sub-topologies gained after another member lost them.
type Event struct {
	At time.Time `json:"at"`
	// Member is the member the change was to.
	Member   string   `json:"member,omitempty"`
	Gained   []string `json:"gained,omitempty"`
	Lost     []string `json:"lost,omitempty"`
	Released []string `json:"released,omitempty"`
	// Running is what the member runs after the change.
	Running []string `json:"running"`
	// RunningAfter is how long from the change until Running ran again
	// (the stop, the releases, the restores and the start).
	RunningAfter time.Duration `json:"running_after_ns"`
	Restores     []Restore     `json:"restores,omitempty"`
	// CaughtUpAfter is how long from the change until every sub-topology
	// started had processed its input up to where the input ended when it
	// started: the change's backlog worked off (0: not yet, or nothing
	// started). Backlog is that backlog, in records, over the
	// sub-topologies started.
	CaughtUpAfter time.Duration `json:"caught_up_after_ns,omitempty"`
	Backlog       uint64        `json:"backlog,omitempty"`
	// Err is why the start failed ("" it did not).
	Err string `json:"error,omitempty"`

	seq uint64 // this member's numbering of its events (record)
}

// Restore is one sub-topology's restore in an Event.
type Restore struct {
	SubTopology string        `json:"sub_topology"`
	Checkpoint  uint64        `json:"checkpoint"`
	Took        time.Duration `json:"took_ns"`
	// Predicted is the restored checkpoint's prediction of a restore of
	// everything from the store (0: none measured yet).
	Predicted       time.Duration `json:"predicted_ns,omitempty"`
	BytesDownloaded int64         `json:"bytes_downloaded"`
	BytesLocal      int64         `json:"bytes_local"`
}

// restoresOf is the restores of what run started (none started empty).
func restoresOf(run *runtime.Running) []Restore {
	var out []Restore
	if run == nil {
		return nil
	}
	for _, s := range run.SubTopologies() {
		if s.Restored == nil {
			continue
		}
		res := s.Restored
		out = append(out, Restore{SubTopology: s.Job.Name, Checkpoint: res.ID, Took: res.Duration, Predicted: res.Figures.PredictedRestore,
			BytesDownloaded: res.BytesDownloaded, BytesLocal: res.BytesLocal})
	}
	return out
}

// record keeps e among the member's last maxEvents.
func (m *Member) record(e Event) uint64 {
	e.Member = m.ID()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.eventSeq++
	e.seq = m.eventSeq
	m.events = append(m.events, e)
	if len(m.events) > maxEvents {
		m.events = slices.Delete(m.events, 0, len(m.events)-maxEvents)
	}
	return e.seq
}

// caughtUp sets event seq's catch-up figures (gone from the last
// maxEvents: nothing to set).
func (m *Member) caughtUp(seq uint64, after time.Duration, backlog uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.events {
		if m.events[i].seq == seq {
			m.events[i].CaughtUpAfter, m.events[i].Backlog = after, backlog
			return
		}
	}
}

// Events is the changes of what this member runs, oldest first (the last
// maxEvents).
func (m *Member) Events() []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.events)
}
