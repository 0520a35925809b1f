package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/internal/testutil/faultproxy"
	"cairn/internal/testutil/natscluster"
	"cairn/internal/testutil/testbin"
	"cairn/internal/testutil/wait"
)

// TestGroupCutOff cuts a member off the cluster (its connections reset,
// new ones refused) with work in flight, for longer than its lease: the
// other member takes its sub-topology over. Whatever the cut-off member
// had computed when its link went down must never reach a stream after
// that: the client would keep such publishes and send them on
// reconnecting. Once the link is back the member joins again, and at the
// end every closed window's top 5 equals the model, each emitted once,
// with Cairn-Out gap-free on the output and the repartition stream.
func TestGroupCutOff(t *testing.T) {
	if !*groupRuns {
		t.Skip("a group of cairn processes on a three-node cluster: run with -cairn.group (.ci/run does)")
	}
	rng := rand.New(rand.NewPCG(graphSeed(t), 361))
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	// The nodes do not tell clients each other's addresses, so the
	// member behind the proxies reaches the cluster only through them.
	c := natscluster.StartWith(t, natscluster.Options{NoAdvertise: true})
	g := newGroupRigOn(t, c, bin, "file", 2*time.Second)
	var proxies []*faultproxy.Proxy
	var urls []string
	for i := range natscluster.Size {
		p := faultproxy.Start(t, c.Addr(i))
		proxies = append(proxies, p)
		urls = append(urls, p.URL())
	}
	// The output stream is the user's, made without fast batches: a
	// publish is then a message on its own, which the server stores
	// whenever it arrives.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err = g.js.CreateStream(ctx, jetstream.StreamConfig{Name: "TOP", Subjects: []string{"top.>"}, Storage: jetstream.FileStorage, Replicas: 3})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	a, b := g.member("a", 0), g.memberVia("b", strings.Join(urls, ","))
	alive := func() { a.alive(); b.alive() }
	in := &lineInput{t: t, js: g.js, rng: rng, step: 5}
	a.start()
	b.start()
	waitGroupSettled(t, a, []string{"a", "b"}, 2)

	// Cut while b works through a burst: what it computed from records
	// fetched before the cut has nowhere to go but the client's buffer.
	in.publish(4000)
	time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
	t0 := time.Now()
	for _, p := range proxies {
		p.Refuse(true)
		p.Reset()
	}
	in.publish(1500)
	if st := waitGroupSettled(t, a, []string{"a"}, 2); len(unitsOf(st, "a")) != 2 {
		t.Fatalf("a runs %v, want both sub-topologies", unitsOf(st, "a"))
	}
	t.Logf("b cut off; a took over %v after the cut (lease TTL 2s)", time.Since(t0).Round(time.Millisecond))
	time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
	for _, p := range proxies {
		p.Refuse(false)
	}
	// Seen through b: if it exited instead of joining again, the wait
	// fails with its log.
	waitGroupSettled(t, b, []string{"a", "b"}, 2)
	t.Logf("b after the cut: %s", firstLine(b.logs.String(), "group: stopped publishing", "lease lost", "sub-topologies lost"))
	in.publish(1000)
	in.closeWindows()
	model := topWordsModel(in.lines, in.times, in.times[len(in.times)-1])
	waitTopWindows(t, g.js, model, 2*time.Minute, alive)
	a.stop()
	b.stop()
	checkTopWords(t, g.js, model)
}

// TestGroupNodeKilled kills the NATS node leading the input stream under a
// running group, with work in flight, and starts it again: members
// connected to it reconnect to the others, the group keeps or regains its
// members, and at the end every closed window's top 5 equals the model,
// each emitted once, with Cairn-Out gap-free on the output and the
// repartition stream.
func TestGroupNodeKilled(t *testing.T) {
	if !*groupRuns {
		t.Skip("a group of cairn processes on a three-node cluster: run with -cairn.group (.ci/run does)")
	}
	rng := rand.New(rand.NewPCG(graphSeed(t), 362))
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	g := newGroupRig(t, bin, "file", 2*time.Second)
	a, b := g.member("a", 0), g.member("b", 1)
	alive := func() { a.alive(); b.alive() }
	in := &lineInput{t: t, js: g.js, rng: rng, step: 5}
	a.start()
	b.start()
	waitGroupSettled(t, a, []string{"a", "b"}, 2)

	in.publish(3000)
	time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	leader, err := g.c.StreamLeader(ctx, g.js, "LINES")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	g.c.Kill(leader)
	t.Logf("killed node %s, the input stream's leader", g.c.Name(leader))
	// The test's own publishes wait for the new leader (an unanswered
	// one would be missing from the stream, not from the model).
	wait.Until(t, time.Minute, "a new leader of LINES", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := g.c.StreamLeader(ctx, g.js, "LINES")
		if err == nil && n == leader {
			return fmt.Errorf("still led by %s", g.c.Name(n))
		}
		return err
	})
	in.publish(1500)
	time.Sleep(time.Duration(1000+rng.IntN(2000)) * time.Millisecond)
	g.c.Restart(leader)
	in.publish(1000)
	in.closeWindows()
	model := topWordsModel(in.lines, in.times, in.times[len(in.times)-1])
	waitTopWindows(t, g.js, model, 2*time.Minute, alive)
	waitGroupSettled(t, a, []string{"a", "b"}, 2)
	for _, m := range []*cairnBinary{a, b} {
		if n := strings.Count(m.logs.String(), "group: sub-topologies failed"); n > 0 {
			t.Logf("a member's sub-topologies failed %d times around the node's death (started again)", n)
		}
	}
	a.stop()
	b.stop()
	checkTopWords(t, g.js, model)
}

// soakGroupRound is a group round of the reliability soak: two or three
// members run the top-words graph on a three-node cluster through two to
// four events, each a member SIGKILLed (started again under its name once
// the others took over) or paused past its lease (SIGSTOP, then SIGCONT
// once the others took over), with input between them. At the end every
// closed window's top 5 equals the model, each emitted once. It returns
// the events, the kills and the lines published.
func soakGroupRound(t *testing.T, bin string, rng *rand.Rand, store string) (what string, kills, lines int) {
	g := newGroupRig(t, bin, store, 2*time.Second)
	names := []string{"a", "b", "c"}[:2+rng.IntN(2)]
	for i, name := range names {
		g.member(name, i).start()
	}
	waitGroupSettled(t, g.members[names[0]], names, 2)
	in := &lineInput{t: t, js: g.js, rng: rng, step: 5}
	var events []string
	for range 2 + rng.IntN(3) {
		in.publish(500 + rng.IntN(2000))
		time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
		victim := names[rng.IntN(len(names))]
		m := g.members[victim]
		var others []string
		for _, n := range names {
			if n != victim {
				others = append(others, n)
			}
		}
		if rng.IntN(2) == 0 {
			m.kill()
			kills++
			events = append(events, "kill "+victim)
			waitGroupSettled(t, g.members[others[0]], others, 2)
			m.start()
		} else {
			if err := m.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			events = append(events, "pause "+victim)
			waitGroupSettled(t, g.members[others[0]], others, 2)
			if err := m.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
		// Seen through the victim: if it exited instead of joining
		// again, the wait fails with its log.
		waitGroupSettled(t, m, names, 2)
	}
	what = fmt.Sprintf("%d members: %s", len(names), strings.Join(events, ", "))
	in.closeWindows()
	model := topWordsModel(in.lines, in.times, in.times[len(in.times)-1])
	waitTopWindows(t, g.js, model, 2*time.Minute, func() {
		for _, n := range names {
			g.members[n].alive()
		}
	})
	for _, n := range names {
		g.members[n].stop()
	}
	checkTopWords(t, g.js, model)
	return what, kills, len(in.lines)
}
