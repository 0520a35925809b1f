package group

import (
	"slices"
	"testing"
)

// What a member runs after a burst of changes follows their order: a
// sub-topology gained and to be released in one change (a member joined
// right after this one was given it) is not run here, nor one released
// after it was gained; one lost and gained back under a new epoch is, and
// so is one released and later given back.
func TestOwnFollowsChangeOrder(t *testing.T) {
	u := func(ks ...int) []Owned {
		var out []Owned
		for _, k := range ks {
			out = append(out, Owned{Range: Range{Sub: Units, Lo: k, Hi: k + 1}})
		}
		return out
	}
	for _, c := range []struct {
		what    string
		changes []Change
		want    []int
	}{
		{"gained, then released in the same change", []Change{{Gained: u(0, 1), Release: u(1)}}, []int{0}},
		{"gained, then released in the next", []Change{{Gained: u(0, 1)}, {Release: u(1)}}, []int{0}},
		{"lost and gained back under a new epoch", []Change{{Gained: u(0)}, {Lost: u(0), Gained: u(0)}}, []int{0}},
		{"released, then given back", []Change{{Gained: u(0, 1)}, {Release: u(1)}, {Gained: u(1)}}, []int{0, 1}},
		{"lost", []Change{{Gained: u(0, 1)}, {Lost: u(0)}}, []int{1}},
	} {
		r := &runner{owned: map[int]bool{}}
		for _, ch := range c.changes {
			r.own(ch)
		}
		if got := r.wanted(); !slices.Equal(got, c.want) {
			t.Errorf("%s: runs %v, want %v", c.what, got, c.want)
		}
	}
}
