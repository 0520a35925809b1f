package runtime

import (
	"errors"
	"strings"
	"testing"

	"cairn/state"
)

// TestAssignment: the whole job is every key group of every sub-topology;
// parts out of the job's range or overlapping are refused by index, and
// Start runs nothing but the whole job outside a group.
func TestAssignment(t *testing.T) {
	j := parseJob(t, t.TempDir(), "key_groups: 8\n")
	p, err := NewPlan(j)
	if err != nil {
		t.Fatal(err)
	}
	all := p.All()
	if err := p.Check(all); err != nil || !p.Whole(all) || len(all) != 1 || all[0].KeyGroups != (state.KeyGroupRange{First: 0, Last: 7}) {
		t.Fatalf("All = %+v (check %v, whole %v)", all, err, p.Whole(all))
	}
	split := Assignment{{Sub: 0, KeyGroups: state.KeyGroupRange{First: 4, Last: 7}}, {Sub: 0, KeyGroups: state.KeyGroupRange{First: 0, Last: 3}}}
	if err := p.Check(split); err != nil || !p.Whole(split) {
		t.Fatalf("two halves: check %v, whole %v", err, p.Whole(split))
	}
	half := split[:1]
	if err := p.Check(half); err != nil || p.Whole(half) {
		t.Fatalf("one half: check %v, whole %v", err, p.Whole(half))
	}
	for _, c := range []struct {
		a    Assignment
		part int
	}{
		{Assignment{{Sub: 1, KeyGroups: state.KeyGroupRange{First: 0, Last: 7}}}, 0},
		{Assignment{{Sub: 0, KeyGroups: state.KeyGroupRange{First: 0, Last: 8}}}, 0},
		{Assignment{{Sub: 0, KeyGroups: state.KeyGroupRange{First: 5, Last: 4}}}, 0},
		{Assignment{{Sub: 0, KeyGroups: state.KeyGroupRange{First: 0, Last: 4}}, {Sub: 0, KeyGroups: state.KeyGroupRange{First: 4, Last: 7}}}, 1},
	} {
		var ae *AssignmentError
		if err := p.Check(c.a); !errors.As(err, &ae) || ae.Part != c.part {
			t.Errorf("Check(%+v) = %v, want an AssignmentError of part %d", c.a, err, c.part)
		}
	}
	if _, err := Start(t.Context(), j, Options{Assignment: half}, quietLog()); !errors.Is(err, ErrPartialAssignment) {
		t.Fatalf("Start with half the key groups: %v, want ErrPartialAssignment", err)
	}
	if _, err := Start(t.Context(), j, Options{Assignment: Assignment{}}, quietLog()); !errors.Is(err, ErrEmptyAssignment) {
		t.Fatalf("Start with nothing: %v, want ErrEmptyAssignment", err)
	}
	if got := p.Parts(0); !p.Whole(got) {
		t.Fatalf("Parts(0) of a one-chain job = %+v, not the whole job", got)
	}
}

// TestWholeSubs: a group member's assignment is whole sub-topologies; part
// of one's key groups is refused naming it.
func TestWholeSubs(t *testing.T) {
	j := parseJob(t, t.TempDir(), "key_groups: 8\n")
	p, err := NewPlan(j)
	if err != nil {
		t.Fatal(err)
	}
	// A plan of three sub-topologies (the job's own cut is not needed to
	// test the arithmetic).
	p.Subs = append(p.Subs, p.Subs[0], p.Subs[0])
	subs, err := p.wholeSubs(p.Parts(2, 0))
	if err != nil || len(subs) != 2 || subs[0] != 0 || subs[1] != 2 {
		t.Fatalf("wholeSubs(Parts(2, 0)) = %v, %v; want [0 2]", subs, err)
	}
	part := Assignment{{Sub: 1, KeyGroups: state.KeyGroupRange{First: 0, Last: 3}}}
	if _, err := p.wholeSubs(part); !errors.Is(err, ErrPartialAssignment) || !strings.Contains(err.Error(), "sub-topology 1 has 4 of its 8 key groups") {
		t.Fatalf("wholeSubs(half of sub-topology 1) = %v", err)
	}
}
