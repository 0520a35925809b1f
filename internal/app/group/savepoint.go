package group

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/runtime"

	"github.com/nats-io/nats.go"
)

// A savepoint of a group's job is group-wide: one name, every
// sub-topology, each taken by the member that runs it, upstream first (as
// one process takes a job graph's). The member asked (any one, through its
// savepoint action) drives it: it reads the assignment and asks each
// sub-topology's owner, over NATS, to take that sub-topology's part. A
// savepoint that cannot be completed leaves nothing behind: the parts
// already taken are removed again.

// savepointSubject is where member takes savepoint parts of job's
// sub-topologies it runs.
func savepointSubject(job, member string) string {
	return "cairn.group." + job + ".savepoint." + member
}

// savepointOp is one request to an owner: take (or check, or remove) the
// part of savepoint Name of sub-topology Sub.
type savepointOp struct {
	Op   string `json:"op"` // "check", "take", "remove"
	Name string `json:"name"`
	Sub  int    `json:"sub"`
}

// savepointReply is an owner's answer: Code an HTTP status, Text for a
// person, Answer the part's (take).
type savepointReply struct {
	Code   int                      `json:"code"`
	Text   string                   `json:"text"`
	Answer runtime.CheckpointAnswer `json:"answer"`
}

// nowRunning is what a member runs now, for the requests other processes
// make of it: its part of a group savepoint (serve) and its figures for a
// status (report).
type nowRunning struct {
	plan *runtime.Plan
	mu   sync.Mutex
	cur  *runtime.Running // nil: runs nothing now
}

func (s *nowRunning) set(r *runtime.Running) {
	s.mu.Lock()
	s.cur = r
	s.mu.Unlock()
}

// savepointStartWait bounds how long a member asked for a savepoint part
// waits for the sub-topology to run (a restore under way).
const savepointStartWait = 30 * time.Second

// running returns the Running of sub-topology name if this member runs it
// now.
func (s *nowRunning) running(name string) *runtime.Running {
	s.mu.Lock()
	cur := s.cur
	s.mu.Unlock()
	if cur == nil {
		return nil
	}
	for _, r := range cur.SubTopologies() {
		if r.Job.Name == name {
			return r
		}
	}
	return nil
}

// serve answers one request (on its own goroutine: a savepoint may take
// minutes).
func (s *nowRunning) serve(msg *nats.Msg) {
	var op savepointOp
	rep := func(r savepointReply) {
		b, _ := json.Marshal(r)
		_ = msg.Respond(b)
	}
	if err := json.Unmarshal(msg.Data, &op); err != nil {
		rep(savepointReply{Code: http.StatusBadRequest, Text: "malformed savepoint request: " + err.Error()})
		return
	}
	if err := checkpoint.ValidateSavepointName(op.Name); err != nil {
		rep(savepointReply{Code: http.StatusBadRequest, Text: err.Error()})
		return
	}
	if op.Sub < 0 || op.Sub >= len(s.plan.Subs) {
		rep(savepointReply{Code: http.StatusBadRequest, Text: fmt.Sprintf("no sub-topology %d", op.Sub)})
		return
	}
	name := s.plan.SubName(op.Sub)
	// A sub-topology just given to this member may still be restoring:
	// wait a while for it to run.
	sub := s.running(name)
	for deadline := time.Now().Add(savepointStartWait); sub == nil && time.Now().Before(deadline); sub = s.running(name) {
		time.Sleep(100 * time.Millisecond)
	}
	if sub == nil {
		rep(savepointReply{Code: http.StatusConflict, Text: fmt.Sprintf("sub-topology %s is not running on this member (it is starting or moving); try again", name)})
		return
	}
	if sub.Store == nil {
		rep(savepointReply{Code: http.StatusConflict, Text: "checkpoints are not configured for this job"})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	switch op.Op {
	case "check":
		if runtime.SavepointExists(ctx, sub.Store, name, op.Name) {
			rep(savepointReply{Code: http.StatusConflict, Text: runtime.SavepointExistsMsg(op.Name)})
			return
		}
		rep(savepointReply{Code: http.StatusOK})
	case "take":
		a, code, text := sub.TakeCheckpoint(ctx, engine.CheckpointRequest{Savepoint: op.Name})
		rep(savepointReply{Code: code, Text: text, Answer: a})
	case "remove":
		if _, _, err := checkpoint.DeleteSavepoint(ctx, sub.Store, name, op.Name); err != nil {
			rep(savepointReply{Code: http.StatusInternalServerError, Text: err.Error()})
			return
		}
		rep(savepointReply{Code: http.StatusOK})
	default:
		rep(savepointReply{Code: http.StatusBadRequest, Text: "unknown savepoint operation " + op.Op})
	}
}

// ErrSavepointMoving is a group savepoint refused because a sub-topology
// has no settled owner (a takeover or handoff is under way).
var ErrSavepointMoving = errors.New("group: a sub-topology is moving between members")

// owners returns each sub-topology's owner from st's assignment, or
// ErrSavepointMoving naming one without a settled, live owner.
func owners(st Status, n int, subName func(int) string) ([]string, error) {
	out := make([]string, n)
	orphaned := map[string]bool{}
	for _, o := range st.Orphaned {
		orphaned[o.Owner] = true
	}
	for _, o := range st.Assignment.Ranges {
		if o.Sub != Units {
			continue
		}
		for k := o.Lo; k < o.Hi && k < len(out); k++ {
			if o.Next != "" || orphaned[o.Owner] {
				return nil, fmt.Errorf("%w: %s goes from %s to %s", ErrSavepointMoving, subName(k), o.Owner, cmp.Or(o.Next, "another member (its owner's lease expired)"))
			}
			out[k] = o.Owner
		}
	}
	for k, m := range out {
		if m == "" {
			return nil, fmt.Errorf("%w: %s has no owner yet", ErrSavepointMoving, subName(k))
		}
	}
	return out, nil
}

// Savepoint takes savepoint name of the whole job of m's group: each
// sub-topology by its owner, upstream first. It answers as the savepoint
// action does (an HTTP status, and the answer as JSON when asJSON, else a
// line per sub-topology).
func (m *Member) Savepoint(ctx context.Context, plan *runtime.Plan, name string, asJSON bool) (int, string) {
	nc := m.js.Conn()
	if err := checkpoint.ValidateSavepointName(name); err != nil {
		return http.StatusBadRequest, err.Error()
	}
	st, err := ReadStatus(ctx, m.js, m.cfg.Job)
	if err != nil {
		return http.StatusBadGateway, "read the group's assignment: " + err.Error()
	}
	own, err := owners(st, len(plan.Subs), plan.SubName)
	if err != nil {
		return http.StatusConflict, err.Error() + "; try again once it runs"
	}
	ask := func(k int, op string) savepointReply {
		b, _ := json.Marshal(savepointOp{Op: op, Name: name, Sub: k})
		rctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
		defer cancel()
		msg, err := nc.RequestWithContext(rctx, savepointSubject(m.cfg.Job, own[k]), b)
		if err != nil {
			return savepointReply{Code: http.StatusBadGateway, Text: fmt.Sprintf("ask member %s: %v", own[k], err)}
		}
		var r savepointReply
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			return savepointReply{Code: http.StatusBadGateway, Text: fmt.Sprintf("member %s answered %q: %v", own[k], msg.Data, err)}
		}
		return r
	}
	for k := range own {
		if r := ask(k, "check"); r.Code != http.StatusOK {
			return r.Code, plan.SubName(k) + " (member " + own[k] + "): " + r.Text
		}
	}
	var answers []runtime.CheckpointAnswer
	var texts []string
	for k := range own {
		r := ask(k, "take")
		if r.Code != http.StatusOK {
			// Nothing half-written: the parts taken are removed again.
			for j := k - 1; j >= 0; j-- {
				if rr := ask(j, "remove"); rr.Code != http.StatusOK {
					m.cfg.Log.Warn("group: remove a part of a failed savepoint", "savepoint", name, "sub_topology", plan.SubName(j), "member", own[j], "err", rr.Text)
				}
			}
			return r.Code, plan.SubName(k) + " (member " + own[k] + "): " + r.Text
		}
		answers = append(answers, r.Answer)
		texts = append(texts, plan.SubName(k)+" (member "+own[k]+"): "+r.Text)
	}
	return runtime.AnswerCheckpoints(answers, texts, asJSON)
}
