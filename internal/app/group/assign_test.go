package group

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// lowerBound is the fewest key groups that must change owner to reach a
// balanced division (every member ⌊K/n⌋ or ⌈K/n⌉): every unowned key group,
// plus each member's holding above ⌊K/n⌋, less one for each of the r
// members allowed ⌈K/n⌉ that holds more than ⌊K/n⌋.
func lowerBound(k int, members []string, cur []string) int {
	n := len(members)
	q, r := k/n, k%n
	held := map[string]int{}
	alive := map[string]bool{}
	for _, m := range members {
		alive[m] = true
	}
	unowned := 0
	for _, o := range cur {
		if alive[o] {
			held[o]++
		} else {
			unowned++
		}
	}
	excess, over := 0, 0
	for _, m := range members {
		if held[m] > q {
			excess += held[m] - q
			over++
		}
	}
	return unowned + excess - min(r, over)
}

func checkBalanced(t *testing.T, k int, members []string, out []string) map[string]int {
	t.Helper()
	count := map[string]int{}
	for kg, o := range out {
		if !slices.Contains(members, o) {
			t.Fatalf("key group %d owned by %q, not a member of %v", kg, o, members)
		}
		count[o]++
	}
	lo, hi := k, 0
	for _, m := range members {
		lo, hi = min(lo, count[m]), max(hi, count[m])
	}
	if hi-lo > 1 {
		t.Fatalf("unbalanced: %v", count)
	}
	return count
}

func randomMembers(rng *rand.Rand, pool []string) []string {
	var ms []string
	for _, m := range pool {
		if rng.IntN(3) > 0 {
			ms = append(ms, m)
		}
	}
	if len(ms) == 0 {
		ms = append(ms, pool[rng.IntN(len(pool))])
	}
	return ms
}

// TestBalanceProperties: from any current division (random owners, some
// gone) and any member set, Balance is balanced within one key group and
// moves exactly the lower bound.
func TestBalanceProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pool := []string{"a", "b", "c", "d", "e", "f", "g"}
	for i := range 3000 {
		k := 1 + rng.IntN(300)
		cur := make([]string, k)
		for kg := range cur {
			if rng.IntN(5) > 0 {
				cur[kg] = pool[rng.IntN(len(pool))]
			}
		}
		members := randomMembers(rng, pool)
		out := Balance(k, members, cur, nil)
		checkBalanced(t, k, members, out)
		moved := 0
		for kg := range out {
			if out[kg] != cur[kg] {
				moved++
			}
		}
		if lb := lowerBound(k, members, cur); moved != lb {
			t.Fatalf("case %d: k=%d members=%v: moved %d, fewest possible %d\ncur=%v\nout=%v", i, k, members, moved, lb, cur, out)
		}
	}
}

// TestBalanceChurn: members joining and leaving one at a time move only the
// key groups they must (a joiner takes ⌊K/n⌋ or ⌈K/n⌉, a leaver's go).
func TestBalanceChurn(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const k = 128
	members := []string{"m0", "m1", "m2"}
	cur := Balance(k, members, nil, nil)
	if c := checkBalanced(t, k, members, cur); c["m0"]+c["m1"]+c["m2"] != k {
		t.Fatalf("not all assigned: %v", c)
	}
	next := 3
	for range 500 {
		if len(members) > 1 && rng.IntN(2) == 0 {
			i := rng.IntN(len(members))
			members = slices.Delete(slices.Clone(members), i, i+1)
		} else {
			members = append(slices.Clone(members), fmt.Sprintf("m%d", next))
			next++
		}
		out := Balance(k, members, cur, nil)
		checkBalanced(t, k, members, out)
		moved := 0
		for kg := range out {
			if out[kg] != cur[kg] {
				moved++
			}
		}
		if lb := lowerBound(k, members, cur); moved != lb {
			t.Fatalf("members %v: moved %d, fewest possible %d", members, moved, lb)
		}
		cur = out
	}
}

// TestRebalanceTotals: several sub-topologies assigned from scratch are
// balanced within one key group per sub-topology and overall.
func TestRebalanceTotals(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 500 {
		var subs []SubTopology
		for i := range 1 + rng.IntN(4) {
			subs = append(subs, SubTopology{Name: fmt.Sprintf("s%d", i), KeyGroups: 1 + rng.IntN(200)})
		}
		members := randomMembers(rng, []string{"a", "b", "c", "d", "e"})
		alive := map[string]bool{}
		for _, m := range members {
			alive[m] = true
		}
		a := Rebalance(subs, members, alive, Assignment{})
		total := map[string]int{}
		for _, o := range a.Ranges {
			if o.Next != "" || o.Epoch == 0 {
				t.Fatalf("from scratch, a range in handoff or without epoch: %+v", o)
			}
			total[o.Owner] += o.Len()
		}
		lo, hi := 1<<30, 0
		for _, m := range members {
			lo, hi = min(lo, total[m]), max(hi, total[m])
		}
		if hi-lo > 1 {
			t.Fatalf("subs %v members %v: totals %v", subs, members, total)
		}
		checkCover(t, subs, a)
	}
}

// checkCover fails unless a's ranges cover every key group of every
// sub-topology exactly once.
func checkCover(t *testing.T, subs []SubTopology, a Assignment) {
	t.Helper()
	for _, sub := range subs {
		seen := make([]int, sub.KeyGroups)
		for _, o := range a.Ranges {
			if o.Sub != sub.Name {
				continue
			}
			for kg := o.Lo; kg < o.Hi; kg++ {
				seen[kg]++
			}
		}
		for kg, n := range seen {
			if n != 1 {
				t.Fatalf("%s key group %d covered %d times: %+v", sub.Name, kg, n, a.Ranges)
			}
		}
	}
}

// TestRebalanceHandoff: a member joining makes the alive owners hand over
// (Next set, owner and epoch kept); a dead owner's ranges move at once with
// new epochs; completing the handoffs gives every moved range an epoch above
// all issued before, and leaves the others' epochs alone.
func TestRebalanceHandoff(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	subs := []SubTopology{{Name: "src", KeyGroups: 128}, {Name: "agg", KeyGroups: 64}}
	pool := []string{"a", "b", "c", "d", "e", "f"}
	members := []string{"a", "b", "c"}
	alive := func(ms ...[]string) map[string]bool {
		out := map[string]bool{}
		for _, l := range ms {
			for _, m := range l {
				out[m] = true
			}
		}
		return out
	}
	a := Rebalance(subs, members, alive(members), Assignment{})
	checkCover(t, subs, a)
	for round := range 300 {
		prev := members
		members = randomMembers(rng, pool)
		// Half the time the leavers are gone (lease expired), else still
		// alive and leaving gracefully.
		live := alive(members)
		if rng.IntN(2) == 0 {
			live = alive(members, prev)
		}
		b := Rebalance(subs, members, live, a)
		checkCover(t, subs, b)
		for _, sub := range subs {
			o0, _, e0 := a.expand(sub)
			o1, n1, e1 := b.expand(sub)
			for kg := range o1 {
				switch {
				case o1[kg] == o0[kg]:
					if e1[kg] != e0[kg] {
						t.Fatalf("round %d: %s/%d kept owner %s but epoch %d → %d", round, sub.Name, kg, o1[kg], e0[kg], e1[kg])
					}
				case live[o0[kg]]:
					t.Fatalf("round %d: %s/%d taken from alive %s without handoff", round, sub.Name, kg, o0[kg])
				default:
					if e1[kg] <= a.Epoch || n1[kg] != "" {
						t.Fatalf("round %d: %s/%d taken over with epoch %d (issued before: %d)", round, sub.Name, kg, e1[kg], a.Epoch)
					}
				}
			}
		}
		// The owners release everything asked of them.
		before := b.Epoch
		for _, o := range slices.Clone(b.Ranges) {
			if o.Next != "" {
				var n int
				b, n = handOver(subs, b, o.Owner, o.Range)
				if n != o.Len() {
					t.Fatalf("round %d: handover of %+v moved %d", round, o, n)
				}
			}
		}
		checkCover(t, subs, b)
		for _, o := range b.Ranges {
			if o.Next != "" || !slices.Contains(members, o.Owner) {
				t.Fatalf("round %d: after handoffs %+v (members %v)", round, o, members)
			}
		}
		if b.Epoch < before {
			t.Fatalf("epoch went back: %d < %d", b.Epoch, before)
		}
		// Settled: rebalancing again changes nothing.
		if c := Rebalance(subs, members, alive(members), b); !c.equal(b) {
			t.Fatalf("round %d: not settled:\n%+v\n%+v", round, b.Ranges, c.Ranges)
		}
		a = b
	}
}

// TestJoinConfigErrors: a configuration that cannot work is refused before
// anything touches NATS, naming the field.
func TestJoinConfigErrors(t *testing.T) {
	good := Config{Job: "j", Member: "m", SubTopologies: []SubTopology{{Name: "s", KeyGroups: 4}}}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"job", func(c *Config) { c.Job = "a.b" }, `job "a.b"`},
		{"member", func(c *Config) { c.Member = "" }, `member ""`},
		{"no subs", func(c *Config) { c.SubTopologies = nil }, "no sub-topologies"},
		{"repeated sub", func(c *Config) { c.SubTopologies = append(c.SubTopologies, SubTopology{Name: "s", KeyGroups: 1}) }, `name "s" empty or repeated`},
		{"key groups", func(c *Config) { c.SubTopologies = []SubTopology{{Name: "s"}} }, "sub-topology s: 0 key groups"},
		{"ttl", func(c *Config) { c.LeaseTTL = 500 * time.Millisecond }, "lease TTL 500ms below one second"},
	} {
		c := good
		tc.edit(&c)
		_, err := Join(context.Background(), nil, c)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrConfig naming %q", tc.name, err, tc.want)
		}
	}
}

// TestJoinURLs: the engines' URLs are the job's, then the discovered
// nodes not among them, each given the first URL's user and password.
func TestJoinURLs(t *testing.T) {
	for _, c := range []struct {
		named      string
		discovered []string
		want       string
	}{
		{"nats://a:4222", []string{"nats://a:4222", "nats://b:4222"}, "nats://a:4222,nats://b:4222"},
		{"nats://u:p@a:4222", []string{"nats://b:4222"}, "nats://u:p@a:4222,nats://u:p@b:4222"},
		{"nats://a:4222,nats://b:4222", nil, "nats://a:4222,nats://b:4222"},
	} {
		if got := joinURLs(c.named, c.discovered); got != c.want {
			t.Errorf("joinURLs(%q, %q) = %q, want %q", c.named, c.discovered, got, c.want)
		}
	}
}
