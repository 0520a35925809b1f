package runtime

import (
	"errors"
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
}
