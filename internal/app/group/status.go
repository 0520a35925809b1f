package group

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoGroup is a job without a group bucket.
var ErrNoGroup = errors.New("group: no group for job")

// MemberStatus is one member's lease as stored.
type MemberStatus struct {
	ID       string `json:"id"`
	Leaving  bool   `json:"leaving,omitempty"`
	Revision uint64 `json:"revision"`
	// KeyGroups is how many key groups the assignment gives it.
	KeyGroups int `json:"key_groups"`
	// Reported: the member answered the status's request for its
	// figures in time; Running are then the sub-topologies it runs now.
	Reported bool        `json:"reported"`
	Running  []SubReport `json:"running,omitempty"`
}

// Status is a group as its bucket holds it: what `cairn group status`
// shows.
type Status struct {
	Job         string         `json:"job"`
	Coordinator string         `json:"coordinator"` // "" none
	Members     []MemberStatus `json:"members"`
	Assignment  Assignment     `json:"assignment"`
	// AssignmentRevision is the assignment key's revision (0: none yet).
	AssignmentRevision uint64 `json:"assignment_revision"`
	// Orphaned ranges are owned by members without a lease: a takeover is
	// due.
	Orphaned []Owned `json:"orphaned,omitempty"`
	// Member and Events are the member's that answered (its /api/group):
	// the changes of what it runs, its takeovers among them.
	Member string  `json:"member,omitempty"`
	Events []Event `json:"events,omitempty"`
}

// ReadStatus reads job's group from its bucket without joining it.
func ReadStatus(ctx context.Context, js jetstream.JetStream, job string) (Status, error) {
	st := Status{Job: job}
	kv, err := js.KeyValue(ctx, Bucket(job))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return st, fmt.Errorf("%w %s", ErrNoGroup, job)
	}
	if err != nil {
		return st, fmt.Errorf("group: status of %s: %w", job, err)
	}
	if e, err := kv.Get(ctx, keyCoordinator); err == nil {
		st.Coordinator = string(e.Value())
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return st, fmt.Errorf("group: status of %s: %w", job, err)
	}
	if e, err := kv.Get(ctx, keyAssignment); err == nil {
		if st.Assignment, err = decodeAssignment(e.Value()); err != nil {
			return st, fmt.Errorf("group: status of %s: revision %d: %w", job, e.Revision(), err)
		}
		st.AssignmentRevision = e.Revision()
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return st, fmt.Errorf("group: status of %s: %w", job, err)
	}
	keys, err := kv.ListKeysFiltered(ctx, keyMemberPre+">")
	if err != nil {
		return st, fmt.Errorf("group: status of %s: members: %w", job, err)
	}
	alive := map[string]bool{}
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired between the listing and the read
		}
		if err != nil {
			return st, fmt.Errorf("group: status of %s: %s: %w", job, k, err)
		}
		var v memberValue
		if err := json.Unmarshal(e.Value(), &v); err != nil {
			return st, fmt.Errorf("group: status of %s: %s revision %d: %w", job, k, e.Revision(), err)
		}
		id := strings.TrimPrefix(k, keyMemberPre)
		alive[id] = true
		n := 0
		for _, o := range st.Assignment.Of(id) {
			n += o.Len()
		}
		st.Members = append(st.Members, MemberStatus{ID: id, Leaving: v.Leaving, Revision: e.Revision(), KeyGroups: n})
	}
	slices.SortFunc(st.Members, func(a, b MemberStatus) int { return strings.Compare(a.ID, b.ID) })
	for _, o := range st.Assignment.Ranges {
		if !alive[o.Owner] {
			st.Orphaned = append(st.Orphaned, o)
		}
	}
	return st, nil
}

// Status reads the group's status as ReadStatus does.
func (m *Member) Status(ctx context.Context) (Status, error) {
	st, err := ReadStatus(ctx, m.js, m.cfg.Job)
	st.Member, st.Events = m.ID(), m.Events()
	if err == nil {
		err = addReports(ctx, m.js, &st)
	}
	return st, err
}
