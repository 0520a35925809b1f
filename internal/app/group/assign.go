package group

import (
	"cmp"
	"fmt"
	"slices"
)

// SubTopology is one part of a job graph that a group divides among its
// members: its key groups [0, KeyGroups) can each be owned by any member.
type SubTopology struct {
	Name      string `json:"name"`
	KeyGroups int    `json:"key_groups"`
}

// Range is the key groups [Lo, Hi) of one sub-topology.
type Range struct {
	Sub string `json:"sub"`
	Lo  int    `json:"lo"`
	Hi  int    `json:"hi"`
}

func (r Range) String() string { return fmt.Sprintf("%s[%d,%d)", r.Sub, r.Lo, r.Hi) }

// Len is the number of key groups in r.
func (r Range) Len() int { return r.Hi - r.Lo }

// Owned is a range with its owner. Epoch is the fencing token of this
// ownership: every change of owner gives the range a new epoch, greater than
// any issued before in the group, so a writer with an older epoch can be
// refused. Next, when set, is the member the range moves to: the owner keeps
// it until it has checkpointed and released it (Member.Release), then Next
// becomes the owner under a new epoch.
type Owned struct {
	Range
	Owner string `json:"owner"`
	Next  string `json:"next,omitempty"`
	Epoch uint64 `json:"epoch"`
}

// Assignment is the group's division of every sub-topology's key groups,
// stored as one KV value and changed only by compare-and-set.
type Assignment struct {
	// Epoch is the last epoch issued; the next owner change gets Epoch+1.
	Epoch  uint64  `json:"epoch"`
	Ranges []Owned `json:"ranges"`
}

// Units is, per owner, the sub-topologies a gives it (the key groups of
// the Units range a member group divides), in the order of a's ranges.
func (a *Assignment) Units() map[string][]int {
	out := map[string][]int{}
	for _, o := range a.Ranges {
		if o.Sub != Units {
			continue
		}
		for k := o.Lo; k < o.Hi; k++ {
			out[o.Owner] = append(out[o.Owner], k)
		}
	}
	return out
}

// owners expands a's ranges of sub into per-key-group owner, next and
// epoch.
func (a *Assignment) expand(sub SubTopology) (owner, next []string, epoch []uint64) {
	owner = make([]string, sub.KeyGroups)
	next = make([]string, sub.KeyGroups)
	epoch = make([]uint64, sub.KeyGroups)
	for _, o := range a.Ranges {
		if o.Sub != sub.Name {
			continue
		}
		for kg := max(o.Lo, 0); kg < min(o.Hi, sub.KeyGroups); kg++ {
			owner[kg], next[kg], epoch[kg] = o.Owner, o.Next, o.Epoch
		}
	}
	return owner, next, epoch
}

// Balance divides keyGroups key groups among members, given their current
// owners cur (cur[kg], "" or a name not in members: unowned). Every member
// gets ⌊K/n⌋ or ⌈K/n⌉ key groups, and as few key groups as possible change
// owner: the members that hold the most keep the larger shares, a member
// over its share gives up its highest key groups, and a key group only moves
// when its owner is gone or over its share. totals (key groups held in other
// sub-topologies, may be nil) breaks ties so that the larger shares go to
// the members with the fewest overall. The result is indexed by key group.
func Balance(keyGroups int, members []string, cur []string, totals map[string]int) []string {
	out := make([]string, keyGroups)
	n := len(members)
	if n == 0 {
		return out
	}
	alive := make(map[string]bool, n)
	for _, m := range members {
		alive[m] = true
	}
	held := make(map[string]int, n)
	for kg := range keyGroups {
		if kg < len(cur) && alive[cur[kg]] {
			held[cur[kg]]++
		}
	}
	// The r members holding the most get q+1 (fewest overall, then name,
	// breaks ties).
	q, r := keyGroups/n, keyGroups%n
	order := slices.Clone(members)
	slices.SortFunc(order, func(a, b string) int {
		if c := cmp.Compare(held[b], held[a]); c != 0 {
			return c
		}
		if c := cmp.Compare(totals[a], totals[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	quota := make(map[string]int, n)
	for i, m := range order {
		quota[m] = q
		if i < r {
			quota[m]++
		}
	}
	// Keep each owner's lowest key groups up to its quota.
	kept := make(map[string]int, n)
	for kg := range keyGroups {
		if kg < len(cur) && alive[cur[kg]] && kept[cur[kg]] < quota[cur[kg]] {
			out[kg] = cur[kg]
			kept[cur[kg]]++
		}
	}
	// Fill the free key groups, in order, to the members under quota. A
	// free key group goes to the owner of its left or right neighbour when
	// that one is under quota, else to the member furthest under (name
	// breaks ties), so that ranges stay few under churn; which free key
	// group goes where does not change how many move.
	deficit := func(m string) int { return quota[m] - kept[m] }
	byName := slices.Clone(members)
	slices.Sort(byName)
	for kg := range keyGroups {
		if out[kg] != "" {
			continue
		}
		pick := ""
		if kg > 0 && deficit(out[kg-1]) > 0 {
			pick = out[kg-1]
		} else if kg+1 < keyGroups && out[kg+1] != "" && deficit(out[kg+1]) > 0 {
			pick = out[kg+1]
		} else {
			for _, m := range byName {
				if deficit(m) > 0 && (pick == "" || deficit(m) > deficit(pick)) {
					pick = m
				}
			}
		}
		out[kg] = pick
		kept[pick]++
	}
	return out
}

// Rebalance is the assignment a coordinator writes for members (alive,
// not leaving) given the current one. A range whose owner is alive but must
// move keeps its owner and gets Next (the two-step handoff); a range whose
// owner is gone (or none) goes to its new owner at once with a new epoch. A
// range already moving keeps moving to its planned member when that is
// still the target. alive is every member holding a lease, including the
// leaving ones (they still hand over). The result is canonical: ranges in
// sub-topology then key-group order, adjacent equal ones merged.
//
// With no members the current assignment stands: there is nobody to give
// it to, and a member that joins later takes the ranges of the gone owners.
func Rebalance(subs []SubTopology, members []string, alive map[string]bool, cur Assignment) Assignment {
	if len(members) == 0 {
		return cur
	}
	next := Assignment{Epoch: cur.Epoch}
	totals := make(map[string]int, len(members))
	for _, sub := range subs {
		owner, pending, epoch := cur.expand(sub)
		// A key group in handoff counts as its target's: the move is
		// already under way.
		basis := make([]string, sub.KeyGroups)
		for kg := range basis {
			basis[kg] = owner[kg]
			if pending[kg] != "" {
				basis[kg] = pending[kg]
			}
		}
		target := Balance(sub.KeyGroups, members, basis, totals)
		newOwner := make([]string, sub.KeyGroups)
		newNext := make([]string, sub.KeyGroups)
		newEpoch := make([]uint64, sub.KeyGroups)
		fresh := make([]bool, sub.KeyGroups)
		for kg := range sub.KeyGroups {
			t := target[kg]
			totals[t]++
			switch {
			case t == "":
				// No members: nothing owned.
			case owner[kg] == t:
				newOwner[kg], newEpoch[kg] = t, epoch[kg]
			case owner[kg] != "" && alive[owner[kg]]:
				newOwner[kg], newNext[kg], newEpoch[kg] = owner[kg], t, epoch[kg]
			default:
				newOwner[kg], fresh[kg] = t, true
			}
		}
		// A new epoch per run of key groups taken over at once.
		for kg := 0; kg < sub.KeyGroups; kg++ {
			if !fresh[kg] {
				continue
			}
			next.Epoch++
			e := next.Epoch
			for j := kg; j < sub.KeyGroups && fresh[j] && newOwner[j] == newOwner[kg]; j++ {
				newEpoch[j] = e
				fresh[j] = false
			}
		}
		next.Ranges = append(next.Ranges, collapse(sub.Name, newOwner, newNext, newEpoch)...)
	}
	return next
}

// collapse turns per-key-group owner, next and epoch into maximal ranges.
func collapse(sub string, owner, next []string, epoch []uint64) []Owned {
	var out []Owned
	for kg := 0; kg < len(owner); kg++ {
		if owner[kg] == "" {
			continue
		}
		j := kg + 1
		for j < len(owner) && owner[j] == owner[kg] && next[j] == next[kg] && epoch[j] == epoch[kg] {
			j++
		}
		out = append(out, Owned{Range: Range{Sub: sub, Lo: kg, Hi: j}, Owner: owner[kg], Next: next[kg], Epoch: epoch[kg]})
		kg = j - 1
	}
	return out
}

// handOver completes the handoffs of owner's moving key groups within r:
// each goes to its Next under a new epoch (one per resulting range). It
// reports how many key groups moved.
func handOver(subs []SubTopology, a Assignment, owner string, r Range) (Assignment, int) {
	out := Assignment{Epoch: a.Epoch}
	moved := 0
	for _, sub := range subs {
		own, next, epoch := a.expand(sub)
		fresh := make([]bool, sub.KeyGroups)
		if sub.Name == r.Sub {
			for kg := max(r.Lo, 0); kg < min(r.Hi, sub.KeyGroups); kg++ {
				if own[kg] == owner && next[kg] != "" {
					own[kg], next[kg], fresh[kg] = next[kg], "", true
					moved++
				}
			}
		}
		for kg := 0; kg < sub.KeyGroups; kg++ {
			if !fresh[kg] {
				continue
			}
			out.Epoch++
			e := out.Epoch
			for j := kg; j < sub.KeyGroups && fresh[j] && own[j] == own[kg]; j++ {
				epoch[j], fresh[j] = e, false
			}
		}
		out.Ranges = append(out.Ranges, collapse(sub.Name, own, next, epoch)...)
	}
	return out, moved
}

// equal reports whether two assignments are the same.
func (a Assignment) equal(b Assignment) bool {
	return a.Epoch == b.Epoch && slices.Equal(a.Ranges, b.Ranges)
}

// Of is the ranges owner holds in a.
func (a Assignment) Of(owner string) []Owned {
	var out []Owned
	for _, o := range a.Ranges {
		if o.Owner == owner {
			out = append(out, o)
		}
	}
	return out
}
