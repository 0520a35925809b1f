package devloop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/testutil/wait"
)

// writeTestJob writes a job file with one keyed stage and an input file of
// n records over 7 keys, 10 ms of event time apart.
func writeTestJob(t *testing.T, module, delivery, stageExtra string, n int) (jobFile, input string) {
	t.Helper()
	dir := t.TempDir()
	jobFile = filepath.Join(dir, "job.yaml")
	yaml := fmt.Sprintf(`name: t
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: op, module: %q, keyed: true%s}
output: {stream: OUT, subject: out, delivery: %s}
key_groups: 16
slots: 2
`, module, stageExtra, delivery)
	if err := os.WriteFile(jobFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for i := range n {
		t0 := int64(1_700_000_000_000 + i*10)
		line, _ := json.Marshal(testRecord{Key: fmt.Sprintf("k%d", i%7), Value: "v", Time: &t0})
		b.Write(append(line, '\n'))
	}
	input = filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(input, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return jobFile, input
}

// TestCairnTestCount: the builtin count is restore-safe: with a restore
// (rescaled 2 -> 3 -> 1 -> 2 slots) every 40 records, the outputs equal an
// uninterrupted run's, and they match an expect file written from that run.
func TestCairnTestCount(t *testing.T) {
	jobFile, input := writeTestJob(t, "builtin:count", "exactly_once", "", 300)
	var out, errb bytes.Buffer
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--restore-every", "40"}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if !strings.Contains(errb.String(), "outputs identical to an uninterrupted run") {
		t.Fatalf("no restore summary:\n%s", errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 300 {
		t.Fatalf("%d outputs, want 300", len(lines))
	}
	last := map[string]string{}
	for _, l := range lines {
		var o testOutput
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatal(err)
		}
		last[o.Key] = o.Value
	}
	for k := range 7 {
		want := 300 / 7
		if k < 300%7 {
			want++
		}
		if got := last[fmt.Sprintf("k%d", k)]; got != fmt.Sprint(want) {
			t.Errorf("k%d: last count %s, want %d", k, got, want)
		}
	}
	expect := filepath.Join(t.TempDir(), "expect.jsonl")
	os.WriteFile(expect, out.Bytes(), 0o644)
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--expect", expect}, &bytes.Buffer{}, &errb); err != nil {
		t.Fatalf("the run's own output does not match it: %v\n%s", err, errb.String())
	}
	// One changed value in the expect file is a difference, shown as a diff.
	os.WriteFile(expect, bytes.Replace(out.Bytes(), []byte(`"value":"1"`), []byte(`"value":"one"`), 1), 0o644)
	errb.Reset()
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--expect", expect}, &bytes.Buffer{}, &errb); err == nil || !strings.Contains(errb.String(), `- {"key_group"`) {
		t.Fatalf("a changed expect file passed: %v\n%s", err, errb.String())
	}
}

// TestCairnTestCatchesMemoryState: an operator that counts in its own
// memory passes an uninterrupted run but --restore-every finds it out, and
// so does it find a processing-time window granted the wall clock (the
// outputs a replay regenerates are not the ones published).
func TestCairnTestCatchesMemoryState(t *testing.T) {
	dir := t.TempDir()
	wasmFile := filepath.Join(dir, "memcount.wasm")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", wasmFile, "./testdata/memcount")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build memcount: %v\n%s", err, out)
	}
	jobFile, input := writeTestJob(t, wasmFile, "exactly_once", "", 200)
	var errb bytes.Buffer
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input}, &bytes.Buffer{}, &errb); err != nil {
		t.Fatalf("an uninterrupted run failed: %v\n%s", err, errb.String())
	}
	errb.Reset()
	err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--restore-every", "50"}, &bytes.Buffer{}, &errb)
	if err == nil || !strings.Contains(errb.String(), "not restore-safe") {
		t.Fatalf("memory state not caught: %v\n%s", err, errb.String())
	}
	t.Logf("caught: %v", err)

	// The wall clock: processing-time windows of 20 ms; a restore (module
	// compile, state restore) takes longer than a window, so the replay
	// lands in other windows than the first run did.
	jobFile, input = writeTestJob(t, "builtin:window_count", "transactional", `, clock: wall, config: {size_ms: 20, time: processing}`, 400)
	errb.Reset()
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--restore-every", "100"}, &bytes.Buffer{}, &errb); err == nil {
		t.Fatalf("a stage on the wall clock passed --restore-every:\n%s", errb.String())
	}
	// The same windows on the ingestion clock are restore-safe.
	jobFile, input = writeTestJob(t, "builtin:window_count", "exactly_once", `, config: {size_ms: 20, time: processing}`, 400)
	errb.Reset()
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--restore-every", "100"}, &bytes.Buffer{}, &errb); err != nil {
		t.Fatalf("processing-time windows on the ingestion clock: %v\n%s", err, errb.String())
	}
}

// TestCairnTestTopN: builtin:rekey sends running counts to one key and
// builtin:top_n emits each 1 s window's three largest, largest first, the
// latest count of an entry replacing the earlier; it is restore-safe.
func TestCairnTestTopN(t *testing.T) {
	dir := t.TempDir()
	jobFile := filepath.Join(dir, "job.yaml")
	os.WriteFile(jobFile, []byte(`name: top
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: all, module: "builtin:rekey"}
  - {name: top, module: "builtin:top_n", keyed: true, config: {n: 3, size_ms: 1000}}
output: {stream: OUT, subject: out, delivery: exactly_once}
watermark: {max_out_of_orderness: 100ms}
`), 0o644)
	var in bytes.Buffer
	add := func(key, value string, t0 int64) {
		line, _ := json.Marshal(testRecord{Key: key, Value: value, Time: &t0})
		in.Write(append(line, '\n'))
	}
	const base = 1_700_000_000_000
	for i, kv := range [][2]string{{"a", "1"}, {"b", "1"}, {"a", "2"}, {"c", "1"}, {"d", "1"}, {"c", "2"}, {"c", "3"}, {"b", "2"}} {
		add(kv[0], kv[1], base+int64(i)*10)
	}
	add("e", "5", base+1500) // the next window
	add("x", "1", base+3000) // closes both
	input := filepath.Join(dir, "in.jsonl")
	os.WriteFile(input, in.Bytes(), 0o644)
	var out, errb bytes.Buffer
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--restore-every", "4"}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	var values []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var o testOutput
		json.Unmarshal([]byte(l), &o)
		values = append(values, o.Value)
	}
	want := []string{fmt.Sprintf("%d:c=3,a=2,b=2", base), fmt.Sprintf("%d:e=5", base+1000)}
	if strings.Join(values, " ") != strings.Join(want, " ") {
		t.Fatalf("outputs %q, want %q", values, want)
	}
}

// TestCairnTestFromSavepoint: a savepoint taken by a running job (here on
// an in-memory log, with a real file store), then cairn test
// --from-savepoint runs the job over new records from that state: the
// counts go on from the saved ones.
func TestCairnTestFromSavepoint(t *testing.T) {
	jobFile, _ := writeTestJob(t, "builtin:count", "exactly_once", "", 0)
	j, err := job.Load(jobFile)
	if err != nil {
		t.Fatal(err)
	}
	storeDir := t.TempDir()
	j.DataDir = t.TempDir()
	j.Checkpoint = &job.Checkpoint{Store: "file://" + storeDir, Interval: time.Hour}
	j.SetDefaults()
	ml := engine.NewMemLog(0)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := runtime.Start(context.Background(), j, runtime.Options{Broker: ml}, log)
	if err != nil {
		t.Fatal(err)
	}
	var recs []testRecord
	for range 5 {
		recs = append(recs, testRecord{Key: "a", Value: "v"})
	}
	ml.Append(testMessages(j, recs)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Engine.Run(ctx) }()
	wait.For(t, time.Minute, "5 records processed", func() bool { return r.Engine.Stats().ProcessedSeq >= 5 })
	id, ok := r.Engine.TriggerCheckpoint(context.Background(), engine.CheckpointRequest{Savepoint: "sp1"})
	if !ok {
		t.Fatal("savepoint not triggered")
	}
	if ev, err := r.Engine.WaitCheckpoint(context.Background(), id); err != nil || ev.Err != nil {
		t.Fatalf("savepoint: %v %v", err, ev.Err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.Close()

	input := filepath.Join(t.TempDir(), "more.jsonl")
	// Later than the saved records (their watermark is restored too).
	os.WriteFile(input, []byte(`{"key":"a","value":"v","time":100}`+"\n"+`{"key":"a","value":"v","time":101}`+"\n"), 0o644)
	var out, errb bytes.Buffer
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--from-savepoint", "sp1", "--store", "file://" + storeDir}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if !strings.Contains(out.String(), `"value":"6"`) || !strings.Contains(out.String(), `"value":"7"`) {
		t.Fatalf("counts do not go on from the savepoint's 5:\n%s\n%s", out.String(), errb.String())
	}
}

// TestCairnTestOneNamedInput: a chain whose one input is named (inputs:
// with one entry) takes records with and without "input", on the input's
// subjects (before, they went to a subject its filter did not take, and
// nothing was processed); another input name is refused with its line.
func TestCairnTestOneNamedInput(t *testing.T) {
	dir := t.TempDir()
	jobFile := filepath.Join(dir, "job.yaml")
	os.WriteFile(jobFile, []byte(`name: named
inputs:
  - {name: lines, stream: LINES, subjects: ["lines.>"]}
stages:
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: OUT, subject: out}
key_groups: 16
`), 0o644)
	input := filepath.Join(dir, "in.jsonl")
	os.WriteFile(input, []byte(`{"key":"a","value":"x"}`+"\n"+`{"input":"lines","key":"a","value":"x"}`+"\n"), 0o644)
	var out, errb bytes.Buffer
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	want := `{"key_group":11,"index":1,"key":"a","value":"1","time":1}` + "\n" + `{"key_group":11,"index":2,"key":"a","value":"2","time":2}` + "\n"
	if out.String() != want {
		t.Fatalf("outputs\n%s\nwant\n%s", out.String(), want)
	}
	os.WriteFile(input, []byte(`{"key":"a","value":"x"}`+"\n"+`{"input":"input","key":"a","value":"x"}`+"\n"), 0o644)
	err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input}, &bytes.Buffer{}, &bytes.Buffer{})
	if want := input + `:2: unknown input "input" (the job's inputs: lines)`; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}
