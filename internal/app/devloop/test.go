package devloop

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/cmdline"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/base/datadir"
	"cairn/state"
)

// testRecord is one line of a `cairn test` input file.
type testRecord struct {
	// Input names the job input the record belongs to (default: the
	// job's only one).
	Input   string            `json:"input,omitempty"`
	Key     string            `json:"key"`
	Value   string            `json:"value"`
	Time    *int64            `json:"time,omitempty"` // event time, Unix ms (default: the ingestion time)
	TS      *int64            `json:"ts,omitempty"`   // ingestion time, Unix ms (default: time, or the previous + 1)
	Headers map[string]string `json:"headers,omitempty"`
	Tick    bool              `json:"tick,omitempty"` // a processing-time tick, not a record
	// Delete, on a table input, removes the key's row (a KV delete).
	Delete bool `json:"delete,omitempty"`

	line int // in the input file
}

// testOutput is one line of `cairn test` output (and of an expect file).
type testOutput struct {
	// Output names the job output (`outputs:`); "" for `output:`, left
	// out of the line, so a job with one output prints what it always did.
	Output   string `json:"output,omitempty"`
	KeyGroup int    `json:"key_group"`
	Index    uint64 `json:"index"`
	Key      string `json:"key"`
	Value    string `json:"value"`
	Time     int64  `json:"time"`
}

// line is the output as `cairn test` prints it.
func (o testOutput) line() string {
	b, _ := json.Marshal(o)
	return string(b)
}

// TestCommand is `cairn test`.
func TestCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("test", "cairn test --job FILE --input RECORDS.jsonl [--expect OUTPUTS.jsonl] [--state] [--restore-every N]", stderr)
	jobFile := fs.String("job", "", "job file (YAML): its stages run; its input and output streams are not used")
	input := fs.String("input", "", "records, one JSON object a line: {\"input\",\"key\",\"value\",\"time\",\"ts\",\"headers\"}, a table's {\"input\",\"key\",\"value\"|\"delete\":true,\"ts\"}, or {\"tick\":true,\"ts\"}")
	expect := fs.String("expect", "", "expected outputs (JSON lines as this command prints them): a difference exits 1")
	showState := fs.Bool("state", false, "print the keyed stages' final state, one JSON object per entry (with its \"stage\" in a job graph)")
	every := fs.Int("restore-every", 0, "after every N records: checkpoint, process N/2 more, kill, restore (on another slot count) and replay; the outputs must equal an uninterrupted run's")
	logLevel := fs.String("log", "warn", "log level")
	fromSP := fs.String("from-savepoint", "", "start from this savepoint's state (and input position): run a new module over saved state before deploying it")
	spStore := fs.String("store", "", "--from-savepoint: the store holding it (default: the job file's checkpoint store)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *jobFile == "" || *input == "" {
		fs.Usage()
		return errors.New("--job and --input are required")
	}
	if *every < 0 {
		return errors.New("--restore-every must not be negative")
	}
	j, err := job.Load(*jobFile)
	if err != nil {
		return err
	}
	recs, err := readTestRecords(*input)
	if err != nil {
		return err
	}
	if err := checkRecords(j, recs, *input); err != nil {
		return err
	}
	graph := isGraphTest(j.Graph())
	if graph && *fromSP != "" {
		return fmt.Errorf("--from-savepoint: job %s is a job graph of %d sub-topologies: each one's savepoint reads on from a position in a repartition stream that cairn test does not have; run the graph from its input file without --from-savepoint", j.Name, len(j.Graph()))
	}
	log := cmdline.NewLogger(stderr, *logLevel)
	var from *savepointSource
	if *fromSP != "" {
		if from, err = openSavepointSource(ctx, j, *spStore, *fromSP); err != nil {
			return err
		}
		defer from.store.Close(ctx)
	}
	run := func(every int, kill bool) (*testResult, error) {
		if graph {
			return runGraphTest(ctx, j, recs, every, kill, log)
		}
		return runTest(ctx, j, recs, every, from, log)
	}
	ref, err := run(0, false)
	if err != nil {
		return err
	}
	if *every > 0 {
		// A job graph's checkpoints put watermark markers into its
		// repartition streams, which move the downstream watermarks: the
		// run with restores is compared with an uninterrupted run that
		// checkpoints after the same records.
		want := ref
		if graph {
			if want, err = run(*every, false); err != nil {
				return err
			}
		}
		got, err := run(*every, true)
		if err != nil {
			return err
		}
		if len(got.replayDiffs) > 0 {
			fmt.Fprintln(stderr, "cairn test: the operator is not restore-safe: a replay after a restore regenerated different outputs (state kept in the module's memory, a clock, randomness?):")
			for _, d := range got.replayDiffs[:min(len(got.replayDiffs), 20)] {
				fmt.Fprintln(stderr, "  "+d)
			}
			return fmt.Errorf("%d regenerated outputs differ after %d restore(s)", len(got.replayDiffs), got.restores)
		}
		if d := diffLines(want.lines, got.lines); d != "" {
			fmt.Fprint(stderr, "cairn test: the outputs with restores differ from an uninterrupted run's (- uninterrupted, + with restores):\n"+d)
			return fmt.Errorf("outputs differ after %d restore(s)", got.restores)
		}
		counts := fmt.Sprint(got.slotCounts)
		if got.subSlots != nil {
			counts = "per sub-topology " + fmt.Sprint(got.subSlots)
		}
		restores := fmt.Sprintf("%d restores", got.restores)
		if got.restores == 1 {
			restores = "1 restore"
		}
		fmt.Fprintf(stderr, "cairn test: %s (rescaled %s), outputs identical to an uninterrupted run\n", restores, counts)
	}
	for _, l := range ref.lines {
		fmt.Fprintln(stdout, l)
	}
	for _, d := range ref.dead {
		fmt.Fprintln(stderr, "dead letter: "+d)
	}
	if *showState {
		for _, l := range ref.state {
			fmt.Fprintln(stdout, l)
		}
	}
	if *expect != "" {
		b, err := os.ReadFile(*expect)
		if err != nil {
			return err
		}
		want, err := normalizeOutputs(string(b))
		if err != nil {
			return fmt.Errorf("%s: %w", *expect, err)
		}
		if d := diffLines(want, ref.lines); d != "" {
			fmt.Fprint(stderr, "cairn test: outputs differ from "+*expect+" (- expected, + got):\n"+d)
			return errors.New("outputs differ from the expected file")
		}
	}
	return nil
}

func readTestRecords(path string) ([]testRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var recs []testRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		var r testRecord
		if err := dec.Decode(&r); err != nil {
			return nil, &RecordError{File: path, Line: n, Reason: err.Error()}
		}
		if !r.Tick && r.Key == "" {
			return nil, &RecordError{File: path, Line: n, Reason: `a record needs a non-empty "key"`}
		}
		r.line = n
		recs = append(recs, r)
	}
	return recs, sc.Err()
}

// testMessages turns records into input messages: the key travels in the
// Cairn-Key header, the event time in Cairn-Time; the ingestion time is ts,
// else the event time, else the previous one + 1 ms, and never goes back.
func testMessages(j *job.Job, recs []testRecord) []engine.Message {
	subject := "input"
	// The job's only input: `input:`, or `inputs:` with one entry.
	if in := j.InputsOf()[0]; len(in.Subjects) > 0 {
		subject = strings.NewReplacer("*", "x", ">", "x").Replace(in.Subjects[0])
	}
	var ts int64
	msgs := make([]engine.Message, 0, len(recs))
	for _, r := range recs {
		ts = ingestTime(ts, r)
		if r.Tick {
			msgs = append(msgs, engine.Message{Subject: engine.TickSubject(j.Name), TsNanos: ts * int64(time.Millisecond)})
			continue
		}
		h := nats.Header{engine.HeaderKey: {r.Key}}
		for k, v := range r.Headers {
			h.Set(k, v)
		}
		if r.Time != nil {
			h.Set(engine.HeaderTime, strconv.FormatInt(*r.Time, 10))
		}
		msgs = append(msgs, engine.Message{Subject: subject, TsNanos: ts * int64(time.Millisecond), Header: h, Data: []byte(r.Value)})
	}
	return msgs
}

type testResult struct {
	lines       []string // outputs, by (key group, index)
	dead        []string
	state       []string
	replayDiffs []string
	restores    int
	slotCounts  []int
	subSlots    [][]int // a job graph's: each start's slot counts, by sub-topology
}

// ingestTime is a record's ingestion time (Unix ms) after a record at ts:
// its "ts", else its event time, else ts + 1 — never before ts.
func ingestTime(ts int64, r testRecord) int64 {
	next := ts + 1
	switch {
	case r.TS != nil:
		next = *r.TS
	case r.Time != nil:
		next = max(*r.Time, next)
	}
	return max(ts, next)
}

// testJobIn is the job as `cairn test` runs it: its data directory and a
// file checkpoint store (checkpoints only when the test takes them) in a
// new temporary directory, which the caller removes.
func testJobIn(j0 *job.Job) (job.Job, string, error) {
	tmp, err := os.MkdirTemp("", "cairn-test-")
	if err != nil {
		return job.Job{}, "", err
	}
	j := *j0
	j.DataDir = filepath.Join(tmp, "data")
	store, err := checkpoint.FileStoreURL(filepath.Join(tmp, "store"), true)
	if err != nil {
		os.RemoveAll(tmp)
		return job.Job{}, "", err
	}
	j.Checkpoint = &job.Checkpoint{Store: store, Interval: time.Hour, Retain: 2}
	j.SetDefaults()
	if err := j.Validate(); err != nil {
		os.RemoveAll(tmp)
		return job.Job{}, "", err
	}
	return j, tmp, nil
}

// runTest runs the job over the records on an in-memory log, with a real
// checkpoint store and real restores in a temporary directory. every > 0
// checkpoints after every `every` records, processes every/2 more, kills
// the job (no final checkpoint) and restores it from that checkpoint on the
// next slot count, so those records are replayed.
func runTest(ctx context.Context, j0 *job.Job, recs []testRecord, every int, from *savepointSource, log *slog.Logger) (*testResult, error) {
	j, tmp, err := testJobIn(j0)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	ml := engine.NewMemLog(0)
	msgs := testMessages(&j, recs)
	restore := ""
	if from != nil {
		// The savepoint's state, copied into this run's store: the job
		// starts from it and the records follow its input position.
		seq, err := from.copyTo(ctx, j.Checkpoint.Store, j.Name)
		if err != nil {
			return nil, err
		}
		ml.StartAfter(seq)
		restore = "savepoint:" + from.name
	}
	res := &testResult{}
	var mu sync.Mutex
	onReplay := func(kg int, idx uint64, key, value []byte, t int64) {
		if err := ml.Replayed(kg, idx, key, value, t); err != nil {
			mu.Lock()
			res.replayDiffs = append(res.replayDiffs, err.Error())
			mu.Unlock()
		}
	}
	counts := []int{j.Slots, min(j.Slots+1, j.KeyGroups), max(j.Slots-1, 1)}
	var r *runtime.Running
	var cancel context.CancelFunc
	var done chan error
	start := func(slots int) error {
		j.Slots = slots
		res.slotCounts = append(res.slotCounts, slots)
		var err error
		if r, err = runtime.Start(ctx, &j, runtime.Options{Broker: ml, OnReplay: onReplay, Restore: restore}, log); err != nil {
			return err
		}
		restore = "" // later restarts restore this run's own checkpoints
		var rctx context.Context
		rctx, cancel = context.WithCancel(ctx)
		done = make(chan error, 1)
		go func() { done <- r.Engine.Run(rctx) }()
		return nil
	}
	stop := func(kill bool) error {
		if kill {
			r.Engine.Kill()
		}
		cancel()
		err := <-done
		r.Close()
		return err
	}
	wait := func() error {
		want := ml.LastSeq()
		// A minute without progress fails the run; a slow machine that
		// makes progress does not.
		deadline, last := time.Now().Add(time.Minute), r.Engine.Stats().ProcessedSeq
		for r.Engine.Stats().ProcessedSeq < want {
			if at := r.Engine.Stats().ProcessedSeq; at > last {
				deadline, last = time.Now().Add(time.Minute), at
			}
			select {
			case err := <-done:
				return fmt.Errorf("the job stopped: %v", err)
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("input not processed through %d: no progress in a minute (at %d)", want, r.Engine.Stats().ProcessedSeq)
			}
		}
		return nil
	}
	if err := start(j.Slots); err != nil {
		return nil, err
	}
	if every == 0 {
		ml.Append(msgs...)
	}
	for pos := 0; every > 0 && pos < len(msgs); {
		end := min(pos+every, len(msgs))
		ml.Append(msgs[pos:end]...)
		if err := wait(); err != nil {
			return nil, err
		}
		id, ok := r.Engine.TriggerCheckpoint(ctx, engine.CheckpointRequest{})
		if !ok {
			return nil, errors.New("checkpoint: one is in flight")
		}
		if ev, err := r.Engine.WaitCheckpoint(ctx, id); err != nil || ev.Err != nil {
			return nil, fmt.Errorf("checkpoint %d: %v %v", id, err, ev.Err)
		}
		replay := min(end+max(every/2, 1), len(msgs))
		ml.Append(msgs[end:replay]...)
		if err := wait(); err != nil {
			return nil, err
		}
		pos = replay
		if pos >= len(msgs) {
			break
		}
		if err := stop(true); err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
		res.restores++
		if err := start(counts[res.restores%len(counts)]); err != nil {
			return nil, fmt.Errorf("restore %d: %w", res.restores, err)
		}
	}
	if err := wait(); err != nil {
		return nil, err
	}
	if err := stop(false); err != nil {
		return nil, err
	}
	for _, o := range sortedOutputs(ml) {
		res.lines = append(res.lines, o.line())
	}
	for _, m := range ml.DeadLetters() {
		res.dead = append(res.dead, fmt.Sprintf("seq %s stage %s: %s", m.Header.Get(engine.HeaderSeq), m.Header.Get(engine.HeaderStage), m.Header.Get(engine.HeaderError)))
	}
	if res.state, err = dumpState(&j, ""); err != nil {
		return nil, err
	}
	return res, nil
}

func sortedOutputs(ml *engine.MemLog) []testOutput {
	var out []testOutput
	for kg, outs := range ml.Outputs() {
		for _, o := range outs {
			out = append(out, testOutput{KeyGroup: kg, Index: o.Index, Key: o.Key, Value: o.Value, Time: o.Time})
		}
	}
	slices.SortFunc(out, func(a, b testOutput) int {
		if a.KeyGroup != b.KeyGroup {
			return a.KeyGroup - b.KeyGroup
		}
		return int(a.Index) - int(b.Index)
	})
	return out
}

// dumpState reads the keyed stage's values from the stopped job's slots;
// stage, when set, is named in each line (a job graph's).
func dumpState(j *job.Job, stage string) ([]string, error) {
	var lines []string
	for i := range j.Slots {
		rng := state.SlotRange(i, j.Slots, j.KeyGroups)
		db, err := state.Open(datadir.Slot(j.DataDir, i), state.Options{KeyGroups: j.KeyGroups, Range: rng, ReadOnly: true})
		if err != nil {
			return nil, err
		}
		err = runtime.KeyedValues(db, rng, func(key, sub, val []byte) error {
			m := map[string]string{"key": string(key), "sub": string(sub), "value": string(val)}
			if stage != "" {
				m["stage"] = stage
			}
			b, _ := json.Marshal(m)
			lines = append(lines, string(b))
			return nil
		})
		db.Close()
		if err != nil {
			return nil, err
		}
	}
	return lines, nil
}

// normalizeOutputs re-encodes an expect file's lines as this command prints
// them, so formatting differences do not count.
func normalizeOutputs(s string) ([]string, error) {
	var lines []string
	for n, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		var o testOutput
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&o); err != nil {
			return nil, fmt.Errorf("line %d: %v", n+1, err)
		}
		lines = append(lines, o.line())
	}
	return lines, nil
}

// diffLines is a readable diff of two line lists ("" when equal): the
// common prefix and suffix are left out.
func diffLines(want, got []string) string {
	if slices.Equal(want, got) {
		return ""
	}
	p := 0
	for p < len(want) && p < len(got) && want[p] == got[p] {
		p++
	}
	s := 0
	for s < len(want)-p && s < len(got)-p && want[len(want)-1-s] == got[len(got)-1-s] {
		s++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "@@ line %d @@\n", p+1)
	for _, l := range want[p : len(want)-s] {
		b.WriteString("- " + l + "\n")
	}
	for _, l := range got[p : len(got)-s] {
		b.WriteString("+ " + l + "\n")
	}
	return b.String()
}

// savepointSource is a savepoint in a store that cairn test starts from.
type savepointSource struct {
	store checkpoint.Store
	name  string
	m     *checkpoint.Manifest
}

func openSavepointSource(ctx context.Context, j *job.Job, storeFlag, name string) (*savepointSource, error) {
	u := storeFlag
	if u == "" {
		if j.Checkpoint == nil {
			return nil, errors.New("--from-savepoint: name the store with --store (the job file has no checkpoint section)")
		}
		var err error
		if u, err = runtime.StoreURL(j); err != nil {
			return nil, err
		}
	}
	s, err := checkpoint.OpenStore(ctx, u)
	if err != nil {
		return nil, err
	}
	m, err := checkpoint.LoadSavepoint(ctx, s, j.Name, name)
	if err != nil {
		s.Close(ctx)
		return nil, fmt.Errorf("--from-savepoint %s: %w", name, err)
	}
	return &savepointSource{store: s, name: name, m: m}, nil
}

// copyTo copies the savepoint (its objects, then its manifest) into the
// store at url for job, and returns its input position.
func (sp *savepointSource) copyTo(ctx context.Context, url, job string) (uint64, error) {
	dst, err := checkpoint.OpenStore(ctx, url)
	if err != nil {
		return 0, err
	}
	defer dst.Close(ctx)
	for _, o := range sp.m.Objects {
		rc, err := sp.store.Get(ctx, o.Path)
		if err != nil {
			return 0, fmt.Errorf("--from-savepoint: %s: %w", o.Path, err)
		}
		err = dst.Put(ctx, o.Path, rc)
		rc.Close()
		if err != nil {
			return 0, err
		}
	}
	data, err := sp.m.Encode()
	if err != nil {
		return 0, err
	}
	if err := dst.Create(ctx, checkpoint.SavepointManifestPath(job, sp.name), data); err != nil {
		return 0, err
	}
	return sp.m.SourceSeq, nil
}
