package group

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// What each member runs, how far it got and its newest checkpoint are not
// in the group's bucket: they change with every record, and the bucket
// holds only what the group decides by compare-and-set. `cairn group
// status` asks the members instead, on one subject all of them answer,
// and waits a moment for the answers; a member that does not answer in
// time shows without figures.

// reportSubject is the subject every member of job's group answers with
// its MemberReport.
func reportSubject(job string) string { return "cairn.group." + job + ".report" }

// SubReport is one sub-topology as the member running it reports it.
type SubReport struct {
	Name string `json:"name"`
	// ProcessedSeq is the input stream's sequence up to which every
	// record has been processed.
	ProcessedSeq uint64 `json:"processed_seq"`
	RecordsIn    uint64 `json:"records_in"`
	// Checkpoint is the newest checkpoint the member committed of it
	// since it started it (0: none yet), CheckpointSeq its input position.
	Checkpoint    uint64 `json:"checkpoint,omitempty"`
	CheckpointSeq uint64 `json:"checkpoint_seq,omitempty"`
	// Stream is the input stream, StreamLastSeq its last sequence when
	// the status was read (filled in by FillLag; 0: not read), Lag the
	// records not yet processed.
	Stream        string `json:"stream,omitempty"`
	StreamLastSeq uint64 `json:"stream_last_seq,omitempty"`
	Lag           uint64 `json:"lag"`
}

// MemberReport is a member's answer on reportSubject.
type MemberReport struct {
	Member  string      `json:"member"`
	Running []SubReport `json:"running"`
}

// report is what this member runs now.
func (s *nowRunning) report() []SubReport {
	s.mu.Lock()
	cur := s.cur
	s.mu.Unlock()
	if cur == nil {
		return nil
	}
	var out []SubReport
	for _, r := range cur.SubTopologies() {
		st := r.Engine.Stats()
		out = append(out, SubReport{Name: r.Job.Name, ProcessedSeq: st.ProcessedSeq, RecordsIn: st.RecordsIn,
			Checkpoint: st.LastChkID, CheckpointSeq: st.LastChkSeq, Stream: r.Job.Input.Stream})
	}
	return out
}

// gatherReports asks every member of job's group for its report and
// collects the answers until want of them came or wait passed.
func gatherReports(ctx context.Context, nc *nats.Conn, job string, want int, wait time.Duration) (map[string]MemberReport, error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(reportSubject(job), inbox, nil); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	out := map[string]MemberReport{}
	for len(out) < want {
		msg, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			break // the wait is over: the rest show without figures
		}
		var r MemberReport
		if json.Unmarshal(msg.Data, &r) == nil && r.Member != "" {
			out[r.Member] = r
		}
	}
	return out, nil
}

// addReports asks the members in st for their reports and adds them,
// with each input stream's lag read from js.
func addReports(ctx context.Context, js jetstream.JetStream, st *Status) error {
	reps, err := gatherReports(ctx, js.Conn(), st.Job, len(st.Members), 2*time.Second)
	if err != nil {
		return err
	}
	last := map[string]uint64{}
	for i := range st.Members {
		m := &st.Members[i]
		r, ok := reps[m.ID]
		if !ok {
			continue
		}
		m.Reported = true
		m.Running = r.Running
		for j := range m.Running {
			s := &m.Running[j]
			if s.Stream == "" {
				continue
			}
			l, ok := last[s.Stream]
			if !ok {
				// A stream that cannot be read now (no leader, gone)
				// leaves its lag unknown; the rest of the status stands.
				if info, err := js.Stream(ctx, s.Stream); err == nil {
					l = info.CachedInfo().State.LastSeq
				}
				last[s.Stream] = l
			}
			if l == 0 {
				continue
			}
			s.StreamLastSeq = l
			if l > s.ProcessedSeq {
				s.Lag = l - s.ProcessedSeq
			}
		}
	}
	return nil
}
