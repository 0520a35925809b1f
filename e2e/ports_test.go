package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/testutil/wait"
)

// portsJob: split, then a keyed stage with two named ports (counts,
// alerts: builtin:threshold); counts go to a named output and, fanned
// out, to a second keyed stage (dedupe: each word's first count) feeding
// output:; alerts go to another named output.
func portsJob(t testing.TB, url, data, store string, slots int) string {
	j := &job.Job{
		Name: "ports", NATS: url,
		Input: job.Input{Stream: "LINES", Subjects: []string{"lines.>"}},
		Stages: []job.Stage{
			{Name: "split", Module: "builtin:split"},
			{Name: "check", Module: "builtin:threshold", Keyed: true, Ports: []string{"counts", "alerts"}, Config: map[string]any{"every": 10}},
			{Name: "first", Module: "builtin:dedupe", Keyed: true, From: []string{"check.counts"}},
		},
		Outputs: []job.NamedOutput{
			{Name: "alerts", From: "check.alerts", Stream: "ALERTS", Subject: "alerts"},
			{Name: "counts", From: "check.counts", Stream: "COUNTS", Subject: "counts"},
		},
		Output: job.Output{Stream: "FIRST", Subject: "first", Delivery: "exactly_once"},
	}
	return testJobYAML(t, j, data, store, slots)
}

// TestJobGraphPorts runs a stage with two output ports, one of them read
// by a named output and by another stage (fan-out), crashes it twice while
// input arrives and restarts it on other slot counts, and checks every
// output exactly: the counts (one per word, the last the word's total),
// the alerts (each multiple of 10 of each word, once), each word's first
// count (once); Cairn-Out gap-free on every output subject.
func TestJobGraphPorts(t *testing.T) {
	rng := rand.New(rand.NewPCG(graphSeed(t), 3))
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "LINES", "lines.>")
	data, store := t.TempDir(), "file://"+t.TempDir()+"?create_dir=true"
	in := &lineInput{t: t, js: js, rng: rng, step: 7}

	counts := func() map[string]int { return lineCounts(in.lines) }
	for round, n := range []int{2, 3, 1} {
		in.publish(400)
		j, err := job.Parse([]byte(portsJob(t, url, data, store, n)))
		if err != nil {
			t.Fatal(err)
		}
		r, err := runtime.Start(context.Background(), j, runtime.Options{}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Downstream) != 1 {
			t.Fatalf("%d sub-topologies, want 2", 1+len(r.Downstream))
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		if round == 2 {
			total := sum(counts())
			wait.Until(t, time.Minute, fmt.Sprintf("%d counts and %d firsts", total, len(counts())), func() error {
				return portsOutputsIn(t, js, total, len(counts()))
			})
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			r.Close()
			break
		}
		join := r.SubTopologies()[1].Engine
		wait.Until(t, time.Minute, "a checkpoint of the second sub-topology", func() error {
			if len(join.Checkpoints()) == 0 {
				return fmt.Errorf("none yet")
			}
			return nil
		})
		waitProcessed(t, r.Engine, uint64(len(in.lines)-rng.IntN(300)))
		for _, s := range r.SubTopologies() {
			s.Engine.Kill()
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		r.Close()
	}

	checkPorts(t, js, counts())
}

// checkPorts checks the three outputs of portsJob against the words'
// counts: the counts (one per word occurrence, the last the word's
// total), the alerts (each multiple of 10 of each word, once), each word's
// first count (once); Cairn-Out gap-free on every output subject.
func checkPorts(t *testing.T, js jetstream.JetStream, model map[string]int) {
	t.Helper()
	checkOutputs(t, js, "COUNTS", "counts", 16, model)
	var alerts []string
	for w, c := range model {
		for n := 10; n <= c; n += 10 {
			alerts = append(alerts, fmt.Sprintf("%s reached %d", w, n))
		}
	}
	got := readStream(t, js, "ALERTS", len(alerts))
	lastValues(t, got, "alerts", 16)
	seen := map[string]int{}
	for _, m := range got {
		seen[string(m.Data())]++
	}
	for _, a := range alerts {
		if seen[a] != 1 {
			t.Errorf("alert %q emitted %d times, want once", a, seen[a])
		}
	}
	if len(got) != len(alerts) {
		t.Errorf("%d alerts, want %d", len(got), len(alerts))
	}
	first := readStream(t, js, "FIRST", len(model))
	last := lastValues(t, first, "first", 16)
	if len(first) != len(model) {
		t.Errorf("%d firsts, want one per word (%d)", len(first), len(model))
	}
	for w := range model {
		if last[w] != "1" {
			t.Errorf("first count of %q: %q, want 1", w, last[w])
		}
	}
	t.Logf("%d words: counts, %d alerts, %d firsts exact", len(model), len(alerts), len(first))
}

// portsOutputsIn says whether portsJob's outputs of both sub-topologies
// are in: counts (the upstream's) and firsts (the downstream's). A lag of
// 0 alone does not say it: it is sampled once a second.
func portsOutputsIn(t *testing.T, js jetstream.JetStream, counts, firsts int) error {
	if n := streamMsgs(t, js, "COUNTS"); n < counts {
		return fmt.Errorf("%d counts", n)
	}
	if n := streamMsgs(t, js, "FIRST"); n < firsts {
		return fmt.Errorf("%d firsts", n)
	}
	return nil
}

// lineCounts counts the words of lines as builtin:split cuts them.
func lineCounts(lines []string) map[string]int {
	m := map[string]int{}
	for _, l := range lines {
		for _, w := range splitWords(l) {
			m[w]++
		}
	}
	return m
}

// TestJobGraphPortsKillNine runs the ports graph (named ports, named
// outputs, fan-out) as the cairn binary, SIGKILLs it 5 times a case at
// random moments while it works through its input, restarts it on random
// slot counts per stage (1-4), and checks all three outputs exactly.
func TestJobGraphPortsKillNine(t *testing.T) {
	forKillCases(t, 20, func(t *testing.T, c *cairnBinary, k killConfig) {
		_, js := connectJS(t, k.url)
		createStream(t, js, "LINES", "lines.>")
		jobFile := writeJob(t, "ports.yaml", portsJob(t, k.url, t.TempDir(), k.store, 2), k.mode)
		c.args = func() []string { return append([]string{"--job", jobFile}, randomSlots(k.rng, "check", "first")...) }
		in := &lineInput{t: t, js: js, rng: k.rng, step: 5}
		in.publish(1200)
		for i := range 5 {
			c.start()
			time.Sleep(time.Duration(150+k.rng.IntN(900)) * time.Millisecond)
			if i == 2 {
				in.publish(1200)
			}
			c.kill()
		}
		model := lineCounts(in.lines)
		total := sum(model)
		c.start()
		wait.Until(t, 2*time.Minute, fmt.Sprintf("%d counts and %d firsts", total, len(model)), func() error {
			c.alive()
			if err := portsOutputsIn(t, js, total, len(model)); err != nil {
				return err
			}
			return subTopologiesCaughtUp(c.httpAddr, 2)
		})
		c.stop()
		checkPorts(t, js, model)
	})
}
