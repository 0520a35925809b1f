package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn/internal/app/job"
	"cairn/internal/testutil/natscluster"
	"cairn/internal/testutil/testbin"
	"cairn/internal/testutil/wait"

	"github.com/nats-io/nats.go/jetstream"
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

var groupCPUProfiles = flag.String("cairn.group.cpuprofile", "", "a directory where BenchmarkGroupMembersCPU's members write CPU profiles (members=N-NAME.pprof)")

var groupCPUOrders = flag.Int("cairn.group.orders", 40_000, "orders BenchmarkGroupMembersCPU publishes (payments come 0-2 per order)")

// BenchmarkGroupMembersCPU measures what spreading a job over a group
// costs: the orders ⋈ payments graph (three sub-topologies) run by 1, 2
// and 3 cairn processes on a three-node cluster, each member with
// GOMAXPROCS=1. Per run: a fresh cluster, the members started and the
// group settled (every sub-topology owned, nothing moving), then the
// members' CPU read (/proc/<pid>/stat), the whole input published, and
// timed until every joined output is in PAID; the members' CPU again.
// It reports events/s, the members' CPU per event, and the cluster's.
//
//	go test ./e2e -run '^$' -bench GroupMembersCPU -benchtime 1x -cairn.group
func BenchmarkGroupMembersCPU(b *testing.B) {
	if !*groupRuns {
		b.Skip("run with -cairn.group")
	}
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 2, 3} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			var events int
			var rp uint64
			var elapsed, cpu, clusterCPU time.Duration
			for range b.N {
				r := groupCPURun(b, bin, n, *groupCPUOrders)
				events += r.events
				elapsed += r.elapsed
				cpu += r.cpu
				clusterCPU += r.clusterCPU
				rp += r.rp
			}
			b.ReportMetric(float64(events)/elapsed.Seconds(), "events/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(events), "member-cpu-µs/event")
			b.ReportMetric(float64(clusterCPU.Microseconds())/float64(events), "nats-cpu-µs/event")
			b.ReportMetric(float64(rp)/float64(events), "rp-msgs/event")
			b.ReportMetric(float64(n), "members")
		})
	}
}

type groupCPUResult struct {
	events                   int
	elapsed, cpu, clusterCPU time.Duration
	rp                       uint64 // messages on the repartition stream
}

func groupCPURun(b *testing.B, bin string, members, orders int) groupCPUResult {
	b.StopTimer()
	defer b.StartTimer()
	c := natscluster.Start(b)
	js, err := jetstream.New(c.Connect())
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range []string{"ORDERS", "PAYMENTS"} {
		c.CreateStream(js, jetstream.StreamConfig{Name: s, Subjects: []string{strings.ToLower(s) + ".>"}, Storage: jetstream.FileStorage})
	}
	store := "file://" + b.TempDir() + "?create_dir=true"
	j := orderPaySpec(c.URL(0))
	j.Group = &job.Group{LeaseTTL: 5 * time.Second, Replicas: 3}
	// A production-like setting, not the tests' (200 ms checkpoints,
	// batches of 64): checkpoints every 10 s, as the Nexmark figures are
	// taken, one slot per member (GOMAXPROCS=1), default batches.
	j.KeyGroups, j.Slots, j.DataDir = 128, 1, b.TempDir()
	j.Checkpoint = &job.Checkpoint{Store: store, Interval: 10 * time.Second, Mode: "incremental"}
	y, err := j.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	jobFile := filepath.Join(b.TempDir(), "orderpay.yaml")
	if err := os.WriteFile(jobFile, y, 0o644); err != nil {
		b.Fatal(err)
	}
	dataRoot := b.TempDir()
	var names []string
	var ms []*cairnBinary
	for i := range members {
		name := string(rune('a' + i))
		m := &cairnBinary{t: b, bin: bin, env: append(os.Environ(), "GOMAXPROCS=1")}
		m.args = func() []string {
			args := []string{"--job", jobFile, "--data", filepath.Join(dataRoot, name), "--member", name, "--nats", c.URL(i % natscluster.Size)}
			if *groupCPUProfiles != "" {
				args = append(args, "--cpuprofile", filepath.Join(*groupCPUProfiles, fmt.Sprintf("members=%d-%s.pprof", members, name)))
			}
			return args
		}
		logOnFailure(b, m)
		m.start()
		names, ms = append(names, name), append(ms, m)
	}
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	waitGroupSettled(b, ms[0], names, 3)
	cpuOf := func() (members time.Duration, cluster time.Duration) {
		for _, m := range ms {
			d, err := natscluster.ProcessCPU(m.cmd.Process.Pid)
			if err != nil {
				b.Fatal(err)
			}
			members += d
		}
		cluster, err := c.CPUTime()
		if err != nil {
			b.Fatal(err)
		}
		return members, cluster
	}
	// At rest first: what the members spend with no input (leases,
	// checkpoints, ticks), the fixed cost a member adds.
	idle0, _ := cpuOf()
	time.Sleep(5 * time.Second)
	idle1, _ := cpuOf()
	in := newOrderPayInput(b, js, rand.New(rand.NewPCG(1, 2)), orders)
	cpu0, ncpu0 := cpuOf()
	t0 := time.Now()
	in.publish(orders)
	want := sum(in.model())
	wait.Until(b, 10*time.Minute, "every joined output", func() error {
		for _, m := range ms {
			m.alive()
		}
		if n := streamMsgs(b, js, "PAID"); n < want {
			return fmt.Errorf("%d of %d joined", n, want)
		}
		return nil
	})
	elapsed := time.Since(t0)
	cpu1, ncpu1 := cpuOf()
	events := in.nextO + in.nextP
	// What crossed the repartition stream: records and watermark markers.
	var rp uint64
	if st, err := js.Stream(context.Background(), "CAIRN_RP_ORDERPAY_2"); err == nil {
		rp = st.CachedInfo().State.LastSeq
	}
	b.Logf("%d members: at rest %v of CPU a second; %d events in %v, members' CPU %v, the cluster's %v; %d messages on the repartition stream", members, (idle1-idle0)/5, events, elapsed.Round(time.Millisecond), (cpu1 - cpu0).Round(time.Millisecond), (ncpu1 - ncpu0).Round(time.Millisecond), rp)
	return groupCPUResult{events: events, elapsed: elapsed, cpu: cpu1 - cpu0, clusterCPU: ncpu1 - ncpu0, rp: rp}
}
