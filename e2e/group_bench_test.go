package e2e

import (
	"context"
	"flag"
	"math/rand/v2"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"cairn/internal/testutil/testbin"
)

var groupTTL = flag.Duration("cairn.group.ttl", 2*time.Second, "lease TTL of BenchmarkGroupTakeover's members")

// BenchmarkGroupTakeover measures a group's takeover: two cairn processes
// run the top-words graph on a three-node cluster while lines arrive
// (about 2,000 a second); each iteration SIGKILLs the member running the
// first sub-topology and times until the repartition stream it writes
// grows again, i.e. the survivor restored it and produces outputs. It
// reports that time beside the lease TTL and the survivor's measured
// restore (from its log), then starts the killed member again.
//
//	go test ./e2e -run '^$' -bench GroupTakeover -benchtime 5x -cairn.group
func BenchmarkGroupTakeover(b *testing.B) {
	if !*groupRuns {
		b.Skip("run with -cairn.group")
	}
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		b.Fatal(err)
	}
	g := newGroupRig(b, bin, "file", *groupTTL)
	js, members := g.js, g.members
	for i, name := range []string{"a", "b"} {
		g.member(name, i).start()
	}
	// Lines keep coming while members die and come back.
	in := &lineInput{t: b, js: js, rng: rand.New(rand.NewPCG(1, 2)), step: 5}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			in.publish(200)
			time.Sleep(100 * time.Millisecond)
		}
	}()
	defer func() {
		cancel()
		wg.Wait()
	}()
	lastSeq := func() uint64 {
		st, err := js.Stream(context.Background(), "CAIRN_RP_TOPWORDS_1")
		if err != nil {
			return 0
		}
		return st.CachedInfo().State.LastSeq
	}
	restoreRe := regexp.MustCompile(`msg="restore complete" checkpoint=\d+ .*duration_ms=(\d+)`)
	st := waitGroupSettled(b, members["a"], []string{"a", "b"}, 2)
	var total, restores time.Duration
	b.ResetTimer()
	for range b.N {
		victim := ownerOf(st, 0)
		other := map[string]string{"a": "b", "b": "a"}[victim]
		before := len(members[other].logs.String())
		members[victim].kill()
		t0 := time.Now()
		time.Sleep(100 * time.Millisecond) // what the dead one had in flight lands
		base := lastSeq()
		for lastSeq() <= base {
			if time.Since(t0) > 2*time.Minute {
				b.Fatalf("no output 2 minutes after the kill:\n%s", tail(members[other].logs.String(), 3000))
			}
			time.Sleep(10 * time.Millisecond)
		}
		took := time.Since(t0)
		total += took
		var restore time.Duration
		if ms := restoreRe.FindAllStringSubmatch(members[other].logs.String()[before:], -1); len(ms) > 0 {
			n, _ := strconv.Atoi(ms[len(ms)-1][1])
			restore = time.Duration(n) * time.Millisecond
		}
		restores += restore
		b.Logf("kill %s: outputs again after %v (lease TTL %v, survivor's restore %v)", victim, took.Round(time.Millisecond), *groupTTL, restore)
		members[victim].start()
		st = waitGroupSettled(b, members[other], []string{"a", "b"}, 2)
	}
	b.StopTimer()
	b.ReportMetric(total.Seconds()/float64(b.N), "takeover-s")
	b.ReportMetric(groupTTL.Seconds(), "lease-ttl-s")
	b.ReportMetric(restores.Seconds()/float64(b.N), "restore-s")
}
