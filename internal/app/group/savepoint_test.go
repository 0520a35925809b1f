package group

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// A group savepoint goes ahead only when every sub-topology has one
// settled, live owner: a range on its way to another member, or owned by a
// member whose lease expired, would have its part taken by a member about
// to stop it.
func TestSavepointOwners(t *testing.T) {
	name := func(k int) string { return "job.s" + strconv.Itoa(k) }
	owned := func(lo, hi int, owner, next string) Owned {
		return Owned{Range: Range{Sub: Units, Lo: lo, Hi: hi}, Owner: owner, Next: next}
	}
	settled := Status{Assignment: Assignment{Ranges: []Owned{owned(0, 2, "a", ""), owned(2, 3, "b", ""), {Range: Range{Sub: "other", Lo: 0, Hi: 9}, Owner: "z"}}}}
	got, err := owners(settled, 3, name)
	if err != nil || !slices.Equal(got, []string{"a", "a", "b"}) {
		t.Fatalf("owners of a settled assignment: %v, %v", got, err)
	}
	for _, c := range []struct {
		what string
		st   Status
		want string
	}{
		{"moving", Status{Assignment: Assignment{Ranges: []Owned{owned(0, 2, "a", ""), owned(2, 3, "b", "a")}}}, "job.s2 goes from b to a"},
		{"orphaned", Status{Assignment: Assignment{Ranges: []Owned{owned(0, 2, "a", ""), owned(2, 3, "b", "")}}, Orphaned: []Owned{owned(2, 3, "b", "")}}, "job.s2 goes from b to another member"},
		{"unassigned", Status{Assignment: Assignment{Ranges: []Owned{owned(0, 2, "a", "")}}}, "job.s2 has no owner yet"},
	} {
		if _, err := owners(c.st, 3, name); !errors.Is(err, ErrSavepointMoving) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrSavepointMoving naming %q", c.what, err, c.want)
		}
	}
}
