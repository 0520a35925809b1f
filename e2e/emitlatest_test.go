package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"cairn/engine"
)

// TestEmitLatestKillNine: a keyed count with delivery transactional and
// emit latest (output.emit), killed with SIGKILL at random moments while
// it processes a known input and restarted each time, then stopped. At
// the end:
//   - every key's last output is its count (the model's), and so is its state;
//   - Cairn-Out is gap-free and unique per key-group subject, each output
//     on its key's subject;
//   - each key's outputs are strictly increasing counts (each is the
//     key's count at the end of one checkpoint interval);
//   - there are at most as many outputs as (key, checkpoint) pairs: per
//     committed checkpoint (all are kept: retain is large), the keys with
//     input between the previous committed checkpoint's source_seq and
//     its own, plus, for each checkpoint that failed while the job went on
//     (its interval is published apart), every key once more.
//
// Seeded: CAIRN_KILL_SEED reruns a failure.
func TestEmitLatestKillNine(t *testing.T) {
	seed := killSeed()
	t.Logf("seed %d (rerun: CAIRN_KILL_SEED=%d go test ./e2e -run TestEmitLatestKillNine -count=1)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 15))
	h := newHarness(t, harnessConfig{op: opCount, store: "file", mode: "incremental", delivery: "transactional, emit: latest", interval: "150ms", retain: 100000})
	kills := killCase(t, rng, h)
	defer func() {
		if t.Failed() {
			t.Logf("cairn logs:\n%s", tail(h.logs.String(), 4000))
		}
	}()

	in := readStream(t, h.js, "EVENTS", int(h.lastSeq))
	keyAt := map[uint64]string{} // input seq -> key
	for _, m := range in {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if k := m.Headers().Get(engine.HeaderKey); k != "" {
			keyAt[md.Sequence.Stream] = k
		}
	}
	if len(keyAt) != h.n {
		t.Fatalf("input stream holds %d input messages, %d were published", len(keyAt), h.n)
	}

	out := readStream(t, h.js, "COUNTS", len(h.model))
	last := lastValues(t, out, "counts", h.cfg.keyGroups) // indexes gap-free, subjects right
	for k, n := range h.model {
		if last[k] != strconv.Itoa(n) {
			t.Errorf("key %q: last output %q, want its count %d", k, last[k], n)
		}
	}
	if len(last) != len(h.model) {
		t.Errorf("%d keys on the output stream, want the model's %d", len(last), len(h.model))
	}
	prev := map[string]int{}
	for _, m := range out {
		k := m.Headers().Get(engine.HeaderKey)
		n, err := strconv.Atoi(string(m.Data()))
		if err != nil || n <= prev[k] {
			t.Fatalf("key %q: output %q after %d, want a larger count", k, m.Data(), prev[k])
		}
		prev[k] = n
	}
	checkState(t, h.data, h.cfg.keyGroups, h.cfg.slots, h.model)

	// The (key, checkpoint) pairs, from the committed manifests.
	seqs := committedSourceSeqs(t, h.store, "killed")
	pairs, from := 0, uint64(0)
	for _, to := range seqs {
		keys := map[string]bool{}
		for seq := from + 1; seq <= to; seq++ {
			if k, ok := keyAt[seq]; ok {
				keys[k] = true
			}
		}
		pairs += len(keys)
		from = max(from, to)
	}
	aborted := strings.Count(h.logs.String(), "checkpoint aborted")
	bound := pairs + aborted*len(h.model)
	if len(out) > bound {
		t.Errorf("%d outputs, more than the %d (key, checkpoint) pairs of %d committed checkpoints (+%d aborted ones × %d keys)", len(out), bound, len(seqs), aborted, len(h.model))
	}
	t.Logf("%d SIGKILLs; %d input events, %d outputs (%d (key, committed checkpoint) pairs, %d checkpoints committed, %d aborted)", kills, h.n, len(out), pairs, len(seqs), aborted)
}

// committedSourceSeqs returns the source_seq of every committed checkpoint
// of job in the file store, in checkpoint id order.
func committedSourceSeqs(t *testing.T, store, job string) []uint64 {
	t.Helper()
	u, err := url.Parse(store)
	if err != nil || u.Scheme != "file" {
		t.Fatalf("store %q: want a file:// URL", store)
	}
	files, err := filepath.Glob(filepath.Join(u.Path, job, "chk-*", "MANIFEST.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no committed checkpoint in %s: %v", u.Path, err)
	}
	type chk struct{ id, seq uint64 }
	var cs []chk
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			ID        uint64 `json:"id"`
			SourceSeq uint64 `json:"source_seq"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		cs = append(cs, chk{m.ID, m.SourceSeq})
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].id < cs[j].id })
	seqs := make([]uint64, len(cs))
	for i, c := range cs {
		if i > 0 && c.seq < cs[i-1].seq {
			t.Fatalf("checkpoint %d has source_seq %d, below checkpoint %d's %d", c.id, c.seq, cs[i-1].id, cs[i-1].seq)
		}
		seqs[i] = c.seq
	}
	return seqs
}

var latestInterval = flag.Duration("cairn.latest-interval", time.Second, "checkpoint interval of BenchmarkEmitLatest")

// BenchmarkEmitLatest measures, on one in-process NATS server and the
// pipeline benchmark's Zipf input (keyedInput): the bare consumer ceiling,
// then the keyed count end to end with delivery transactional, every
// output (before) and with emit latest, checkpoints every
// -cairn.latest-interval to a local file store. msgs/s is input events
// per second end to end: from the start until the graceful stop returned,
// every output published and acknowledged (a transactional job publishes
// a checkpoint's outputs after its commit, so the time until processed,
// processed/s, leaves out what the last commits publish); outputs is how
// many the output stream holds; cpu-ns/msg is the process's CPU (user + system:
// server, client and cairn, getrusage) during the timed phase per input
// message, which a machine shared with other work disturbs less than the
// wall clock (on 2 cores a CPU-bound phase runs at 2 cores ÷ it). Run with
// -benchtime=1x:
//
//	go test ./e2e -run '^$' -bench EmitLatest -benchtime=1x -cairn.msgs=1000000
func BenchmarkEmitLatest(b *testing.B) {
	url := startNATS(b)
	_, js := connectJS(b, url)
	n := *benchMsgs
	keyedInput(b, js, n)
	b.Run("ceiling", func(b *testing.B) {
		for range b.N {
			host, cpu := readHostTicks(), cpuTime(b)
			b.ReportMetric(float64(n)/drainCeiling(b, js, "EVENTS", n).Seconds(), "msgs/s")
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(n), "cpu-ns/msg")
			reportSteal(b, host)
		}
	})
	for i, tc := range []struct{ name, module, emit string }{
		{"wasm-transactional", "builtin:count", "all"},
		{"wasm-transactional-latest", "builtin:count", "latest"},
		{"native-transactional-latest", "native:count", "latest"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for j := range b.N {
				out := fmt.Sprintf("LATEST%d_%d", i, j)
				yaml := fmt.Sprintf(`
name: latest%d_%d
nats: %s
input:  {stream: EVENTS, subjects: ["events.>"]}
stages:
  - {name: count, module: "%s", keyed: true}
output: {stream: %s, subject: %s, delivery: transactional, emit: %s}
key_groups: 128
slots: %d
data_dir: %s
batch_size: 1024
checkpoint: {store: "file://%s?create_dir=true", interval: %s, mode: incremental}
`, i, j, url, tc.module, out, strings.ToLower(out), tc.emit, *benchSlots, b.TempDir(), b.TempDir(), *latestInterval)
				r, stop := runJobTimed(b, yaml, "")
				host, cpu := readHostTicks(), cpuTime(b)
				start := time.Now()
				waitProcessed(b, r.Engine, uint64(n))
				el := time.Since(start)
				if err := stop(); err != nil {
					b.Fatal(err)
				}
				total := time.Since(start)
				cpu = cpuTime(b) - cpu
				reportSteal(b, host)
				s, err := js.Stream(context.Background(), out)
				if err != nil {
					b.Fatal(err)
				}
				info, err := s.Info(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(n)/total.Seconds(), "msgs/s")
				b.ReportMetric(float64(n)/el.Seconds(), "processed/s")
				b.ReportMetric(float64(info.State.Msgs), "outputs")
				b.ReportMetric(float64(cpu)/float64(n), "cpu-ns/msg")
			}
		})
	}
}
