package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/testutil/testbin"
)

// TestImportedSavepointRunsOn: a running job's savepoint (taken at its
// graceful stop, exactly-once delivery), exported with `cairn state export`
// and imported back as another savepoint with `cairn state import`, is what
// `cairn run --restore savepoint:NAME` starts from on another slot count,
// with a real NATS server: every count goes on exactly (the engine's output
// counters travel through the JSON lines too, or the sink would publish
// duplicates or skip outputs).
func TestImportedSavepointRunsOn(t *testing.T) {
	h := newHarness(t, harnessConfig{store: "file", mode: "incremental", delivery: "exactly_once", interval: "100ms", slots: 2})
	h.publish(3000)
	h.args = []string{"--savepoint-on-stop", "before"}
	h.runToEnd()

	file := filepath.Join(t.TempDir(), "state.jsonl")
	cairn := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(h.bin, append(args, "--store", h.store, "--job", "killed")...)
		cmd.Env = append(os.Environ(), h.env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("cairn %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	t.Log(cairn("state", "export", "--checkpoint", "savepoint:before", "--out", file))
	t.Log(cairn("state", "import", "--savepoint", "copy", "--in", file))
	if out := cairn("state", "diff", "savepoint:before", "savepoint:copy"); !strings.Contains(out, "hold the same state") {
		t.Fatalf("the imported savepoint differs from the exported one:\n%s", out)
	}

	h.publish(3000)
	h.args = []string{"--restore", "savepoint:copy", "--slots", "3"}
	h.runToEnd()
	if !strings.Contains(h.logs.String(), `"savepoint":"copy"`) && !strings.Contains(h.logs.String(), "savepoint=copy") {
		t.Fatalf("the second run did not restore savepoint copy:\n%s", tail(h.logs.String(), 4000))
	}
	h.cfg.slots = 3 // the local state is now the 3 slots'
	h.verify()
}

// TestStateSplitStageRunsOn: a keyed stage split in two. Job v1 counts
// per key in one stage (stats) and stops with a savepoint; v2 counts in
// stage count, then again in stage again, a second sub-topology behind a
// repartition stream, which must start from the counts too. With the
// commands of docs/UPGRADES.md — `cairn state migrate --rename stats=count`
// for the first sub-topology's savepoint and `--into again` for the
// second's — v2 restored from the savepoint onto 3 slots with a real NATS
// server goes on counting in both stages from v1's counts: every key's last
// output is its count over v1's and v2's records, where a second stage
// started empty would count only v2's; and v2's outputs continue v1's on
// the output stream without a gap or a repeat.
func TestStateSplitStageRunsOn(t *testing.T) {
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "EVENTS", "events.>")
	dir := t.TempDir()
	storeURL := "file://" + filepath.Join(dir, "store") + "?create_dir=true"
	writeJob := func(name string, slots int, stages ...job.Stage) (string, *job.Job) {
		j := &job.Job{Name: "split", NATS: url, Input: job.Input{Stream: "EVENTS", Subjects: []string{"events.>"}}, Stages: stages,
			Output: job.Output{Stream: "COUNTS", Subject: "counts", Delivery: "exactly_once"}}
		y := testJobYAML(t, j, filepath.Join(dir, "data-"+name), storeURL, slots)
		p := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		if j, err = job.Parse([]byte(y)); err != nil {
			t.Fatal(err)
		}
		return p, j
	}
	v1, j1 := writeJob("v1", 2, job.Stage{Name: "stats", Module: "builtin:count", Keyed: true})
	v2, j2 := writeJob("v2", 3, job.Stage{Name: "count", Module: "builtin:count", Keyed: true}, job.Stage{Name: "again", Module: "builtin:count", Keyed: true})
	cairn := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("cairn %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	want := map[string]int{}
	publish := func(n, from int) {
		var msgs []*nats.Msg
		for i := from; i < from+n; i++ {
			k := fmt.Sprintf("w%04d", (i*7)%2500)
			want[k]++
			msgs = append(msgs, &nats.Msg{Subject: "events.x", Header: nats.Header{engine.HeaderKey: []string{k}}, Data: []byte("x")})
		}
		publishAll(t, js, msgs)
	}
	run := func(j *job.Job, ro runtime.Options, outputs int) {
		t.Helper()
		r, err := runtime.Start(context.Background(), j, ro, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		stop := runStarted(t, r)
		readStream(t, js, "COUNTS", outputs)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}

	// v1 counts 3,000 records and stops with a savepoint.
	publish(3000, 0)
	run(j1, runtime.Options{SavepointOnStop: "v1"}, 3000)

	// v2's savepoint: one per sub-topology. The rename reads the state
	// with v1's stage names (stats is not a stage of v2).
	t.Log(cairn("state", "migrate", "--job-file", v1, "--from", "savepoint:v1", "--to", "v2", "--rename", "stats=count", "--reset-outputs"))
	out := cairn("state", "migrate", "--job-file", v2, "--from", "savepoint:v1", "--to", "v2", "--into", "again", "--move-outputs")
	if !strings.Contains(out, "savepoint v2 of job split.s1: read ") || !strings.Contains(out, "every sub-topology of the job needs its savepoint v2") {
		t.Fatalf("migrate --into said %q", out)
	}
	t.Log(out)
	exp := cairn("state", "export", "--job-file", v2, "--job", "split.s1", "--checkpoint", "savepoint:v2")
	if !strings.Contains(exp, `"source_stream":"CAIRN_RP_SPLIT_1","source_seq":0`) || strings.Count(exp, `"stage":"again"`) != len(want) ||
		strings.Count(exp, `"stage":"_system"`) != strings.Count(exp, `"stage":"_system","kind":"counter"`) {
		t.Fatalf("the second sub-topology's savepoint (%d keys counted):\n%s", len(want), tail(exp, 2000))
	}

	// v2 from it, over 3,000 more records of old and new keys.
	publish(3000, 3000)
	run(j2, runtime.Options{Restore: "savepoint:v2"}, 6000)
	got := readStream(t, js, "COUNTS", 6000)
	if len(got) != 6000 {
		t.Fatalf("%d outputs, want 6000", len(got))
	}
	last := lastValues(t, got, "counts", 16) // Cairn-Out gap-free per key group, over v1's and v2's
	for k, n := range want {
		if last[k] != strconv.Itoa(n) {
			t.Fatalf("key %s: last output %q, want %d", k, last[k], n)
		}
	}
	if len(last) != len(want) {
		t.Fatalf("%d keys in the outputs, want %d", len(last), len(want))
	}
}
