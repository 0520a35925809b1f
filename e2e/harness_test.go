package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/testutil/testbin"
	"cairn/internal/testutil/testservers"
)

// The builtins the harness can run (harnessConfig.op), each with an exact
// model of its outputs (see expected).
const (
	opCount       = "count"        // builtin:count
	opSplit       = "split"        // builtin:split -> builtin:count
	opWindowEvent = "window-event" // builtin:window_count, time: event
	opWindowProc  = "window-proc"  // builtin:window_count, time: processing
	opDedupe      = "dedupe"       // builtin:dedupe with a state TTL
)

// harnessOps are every builtin the harness runs.
var harnessOps = []string{opCount, opSplit, opWindowEvent, opWindowProc, opDedupe}

const killJob = `
name: killed
input:  {stream: EVENTS, subjects: ["events.>"]}
stages:
%s
output: {stream: COUNTS, subject: counts, delivery: %s}
key_groups: %d
slots: %d
batch_size: 128
checkpoint: {interval: %s, mode: %s, retain: %d}
watermark: {max_out_of_orderness: %dms}
`

// harness runs the cairn binary as a child process over a keyed job (one
// of harnessOps), against a NATS server and a checkpoint store that live
// apart from the child (so they survive its deaths), and computes the exact
// model of the outputs from the input stream as stored.
type harness struct {
	t        *testing.T
	cfg      harnessConfig
	bin      string
	natsURL  string
	js       jetstream.JetStream
	store    string
	env      []string
	data     string
	jobFile  string
	httpAddr string
	logs     syncBuffer
	model    map[string]int // count, split: the final count of every key
	n        int            // input messages published so far (the flush not included)
	lastSeq  uint64         // input stream sequence of the last one
	args     []string       // extra arguments of cairn run
	baseMs   int64          // window-event: event time of input 0
	maxEv    int64          // window-event: largest event time published
	flushed  bool           // window-event: the closing event is published

	coreMu  sync.Mutex
	coreGot map[[2]string]int // core delivery: (key, value) received, times
}

type harnessConfig struct {
	store     string // "file" or "s3", or a URL
	mode      string
	delivery  string // exactly_once, dedupe, transactional or core
	interval  string
	retain    int
	dupWindow time.Duration

	op        string        // one of harnessOps ("" is count)
	module    string        // count: a module file to run instead of builtin:count (e2e/languages_test.go)
	keys      int           // distinct keys of the input (default 257; windows 61)
	windowMs  int64         // window_count size (default 200 ms; processing time 50 ms)
	ttl       time.Duration // dedupe's state TTL (default 20 ms)
	evStepMs  int64         // window-event: event time step per input (default 1 ms)
	boundMs   int64         // watermark max_out_of_orderness (default 500 ms)
	natsURL   string        // a NATS server to use; "" starts an embedded one
	keyGroups int           // default 32
	slots     int           // default 2
	// restore is appended to the job file as its restore: section (like
	// "{mode: online, download_rate: 64KiB}"); "" leaves the defaults.
	restore string
}

func newHarness(t *testing.T, c harnessConfig) *harness {
	t.Helper()
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	if c.op == "" {
		c.op = opCount
	}
	if c.keys == 0 {
		c.keys = 257
		if c.op == opWindowEvent || c.op == opWindowProc {
			c.keys = 61
		}
	}
	if c.windowMs == 0 {
		// Processing-time windows of a few clock steps: a burst of input
		// spans several, and a window often ends between two bursts, where
		// only a logged tick closes it.
		c.windowMs = 200
		if c.op == opWindowProc {
			c.windowMs = 50
		}
	}
	if c.ttl == 0 {
		// A multiple of the clock step: a record exactly at the expiry
		// (which passes again) is common, so the model checks the boundary.
		c.ttl = 20 * time.Millisecond
	}
	if c.evStepMs == 0 {
		c.evStepMs = 1
	}
	if c.boundMs == 0 {
		c.boundMs = 500
	}
	if c.keyGroups == 0 {
		c.keyGroups = 32
	}
	if c.slots == 0 {
		c.slots = 2
	}
	if c.retain == 0 {
		c.retain = 2
	}
	h := &harness{t: t, cfg: c, bin: bin, model: map[string]int{}, baseMs: time.Now().UnixMilli()}
	h.natsURL = c.natsURL
	if h.natsURL == "" {
		h.natsURL = startNATS(t)
	}
	var nc *nats.Conn
	nc, h.js = connectJS(t, h.natsURL)
	createStream(t, h.js, "EVENTS", "events.>")
	if c.dupWindow > 0 {
		if _, err := h.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "COUNTS", Subjects: []string{"counts.>"}, Duplicates: c.dupWindow}); err != nil {
			t.Fatal(err)
		}
	}
	if c.delivery == "core" {
		// Core outputs exist only for a subscriber that is there: this one
		// outlives every child.
		h.coreGot = map[[2]string]int{}
		sub, err := nc.Subscribe("counts.>", func(m *nats.Msg) {
			h.coreMu.Lock()
			h.coreGot[[2]string{m.Header.Get(engine.HeaderKey), string(m.Data)}]++
			h.coreMu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		_ = sub.SetPendingLimits(-1, -1)
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	switch c.store {
	case "file":
		h.store = "file://" + t.TempDir() + "?create_dir=true"
	case "s3":
		h.store = testservers.StartGoFakeS3(t)
		h.env = s3Env()
	default:
		h.store = c.store
		h.env = s3Env()
	}
	dir := t.TempDir()
	h.data = filepath.Join(dir, "data")
	h.jobFile = filepath.Join(dir, "job.yaml")
	job := fmt.Sprintf(killJob, h.stages(), c.delivery, c.keyGroups, c.slots, c.interval, c.mode, c.retain, c.boundMs)
	if c.restore != "" {
		job += "restore: " + c.restore + "\n"
	}
	if err := os.WriteFile(h.jobFile, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	h.httpAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	return h
}

// stages is the job file's stages section for the builtin under test.
func (h *harness) stages() string {
	c := h.cfg
	switch c.op {
	case opCount:
		if c.module != "" {
			return fmt.Sprintf(`  - {name: count, module: %q, keyed: true}`, c.module)
		}
		return `  - {name: count, module: "builtin:count", keyed: true}`
	case opSplit:
		return "  - {name: split, module: \"builtin:split\"}\n  - {name: count, module: \"builtin:count\", keyed: true}"
	case opWindowEvent:
		return fmt.Sprintf(`  - {name: win, module: "builtin:window_count", keyed: true, config: {size_ms: %d, time: event}}`, c.windowMs)
	case opWindowProc:
		return fmt.Sprintf(`  - {name: win, module: "builtin:window_count", keyed: true, config: {size_ms: %d, time: processing}}`, c.windowMs)
	case opDedupe:
		return fmt.Sprintf(`  - {name: first, module: "builtin:dedupe", keyed: true, ttl: %s}`, c.ttl)
	}
	h.t.Fatalf("harness: unknown builtin %q", c.op)
	return ""
}

func s3Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + testservers.AccessKey, "AWS_SECRET_ACCESS_KEY=" + testservers.SecretKey, "AWS_REGION=" + testservers.Region, "AWS_EC2_METADATA_DISABLED=true"}
}

// input is input message i of the builtin under test: a deterministic
// function of i, so that a failure replays with its seed.
func (h *harness) input(i int) *nats.Msg {
	c := h.cfg
	key := fmt.Sprintf("key-%d", (i*31)%c.keys)
	m := &nats.Msg{Subject: "events.x", Header: nats.Header{engine.HeaderKey: []string{key}}, Data: []byte("x")}
	switch c.op {
	case opCount:
		h.model[key]++
	case opSplit:
		// 1 to 3 words with case and punctuation for split to strip.
		var words []string
		for j := range 1 + i%3 {
			w := fmt.Sprintf("Word-%d%s", (i*31+j*17)%c.keys, []string{"", ",", ".", "!"}[(i+j)%4])
			words = append(words, w)
		}
		line := strings.Join(words, " ")
		for _, w := range splitWords(line) {
			h.model[w]++
		}
		m.Header = nats.Header{}
		m.Data = []byte(line)
	case opWindowEvent:
		// In order up to a jitter under the watermark bound: never late.
		ev := h.baseMs + int64(i)*c.evStepMs - int64(i*7919)%c.boundMs
		h.maxEv = max(h.maxEv, ev)
		m.Header.Set(engine.HeaderTime, strconv.FormatInt(ev, 10))
	case opDedupe:
		m.Data = []byte("v" + strconv.Itoa(i))
	}
	return m
}

// publish appends count input messages. For the builtins on the ingestion
// clock it spreads them over a few dozen clock steps (parts of 250, 3 ms
// apart), so that windows and TTLs end inside the input, not only between
// two publishes.
func (h *harness) publish(count int) {
	part := count
	if h.cfg.op == opWindowProc || h.cfg.op == opDedupe {
		part = 250
	}
	for from := h.n; from < h.n+count; from += part {
		if from > h.n {
			time.Sleep(3 * time.Millisecond)
		}
		var msgs []*nats.Msg
		for i := from; i < min(from+part, h.n+count); i++ {
			msgs = append(msgs, h.input(i))
		}
		publishAll(h.t, h.js, msgs)
	}
	h.n += count
	h.noteLastSeq()
}

// publishPaced appends count input messages at rate per second, each
// acknowledged before the next; it returns when the last is stored.
func (h *harness) publishPaced(count, rate int) error {
	start := time.Now()
	for k := range count {
		if d := time.Until(start.Add(time.Duration(k) * time.Second / time.Duration(rate))); d > 0 {
			time.Sleep(d)
		}
		if _, err := h.js.PublishMsg(context.Background(), h.input(h.n)); err != nil {
			return fmt.Errorf("publish input %d: %w", h.n, err)
		}
		h.n++
	}
	return nil
}

func (h *harness) noteLastSeq() {
	h.t.Helper()
	s, err := h.js.Stream(context.Background(), "EVENTS")
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	h.lastSeq = info.State.LastSeq
}

// closeInput publishes what the model needs to see every output: for
// event-time windows, an event past the watermark bound after the last
// window, so that every window of the input closes (its own stays open and
// is not in the model).
func (h *harness) closeInput() {
	if h.cfg.op != opWindowEvent || h.flushed {
		return
	}
	h.flushed = true
	m := &nats.Msg{Subject: "events.x", Header: nats.Header{engine.HeaderKey: []string{flushKey}}, Data: []byte("x")}
	m.Header.Set(engine.HeaderTime, strconv.FormatInt(h.maxEv+h.cfg.boundMs+2*h.cfg.windowMs, 10))
	publishAll(h.t, h.js, []*nats.Msg{m})
	h.noteLastSeq()
}

const flushKey = "flush"

// start runs the binary; extraEnv arms failpoints.
func (h *harness) start(extraEnv ...string) (*exec.Cmd, chan error) {
	cmd := exec.Command(h.bin, append([]string{"run", "--job", h.jobFile, "--nats", h.natsURL, "--store", h.store, "--data", h.data, "--http", h.httpAddr}, h.args...)...)
	cmd.Env = append(append(os.Environ(), h.env...), extraEnv...)
	cmd.Stdout, cmd.Stderr = &h.logs, &h.logs
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, done
}

func (h *harness) stats() (engine.Stats, bool) {
	var st engine.Stats
	resp, err := http.Get("http://" + h.httpAddr + "/api/stats")
	if err != nil {
		return st, false
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st) == nil
}

// runToEnd starts the job, waits until it processed the whole input (and,
// for processing-time windows, until the logged ticks closed every window
// of the model) and stops it gracefully.
func (h *harness) runToEnd() {
	h.t.Helper()
	h.closeInput()
	mark := len(h.logs.String())
	cmd, done := h.start()
	h.awaitEnd(cmd, done, mark)
}

// awaitEnd waits until the running child (started when the logs were mark
// long) processed the whole input and published every output it can
// before a stop, and stops it gracefully.
func (h *harness) awaitEnd(cmd *exec.Cmd, done chan error, mark int) {
	h.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	until := max(h.lastSeq, uint64(h.n))
	var want int // window-proc: outputs to wait for
	if h.cfg.op == opWindowProc {
		_, exp := h.expected()
		want = exp.outputs
	}
	var processed time.Time // when the whole input was processed
	for {
		if st, ok := h.stats(); ok && st.ProcessedSeq >= until && strings.Contains(h.logs.String()[mark:], "job running") {
			if h.outputsAtLeast(want) {
				break
			}
			if processed.IsZero() {
				processed = time.Now()
			}
			// The last windows close at most a window, a tick retry and a
			// checkpoint interval later. Fewer outputs than the model: stop
			// anyway, and let verify show the difference.
			if time.Since(processed) > time.Minute {
				h.t.Logf("fewer outputs than the model's %d a minute after the input was processed", want)
				break
			}
		}
		select {
		case err := <-done:
			h.t.Fatalf("cairn exited: %v\n%s", err, tail(h.logs.String(), 6000))
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			h.t.Fatalf("timed out processing %d messages\n%s", h.n, tail(h.logs.String(), 6000))
		}
		time.Sleep(30 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		h.t.Fatalf("cairn stop: %v\n%s", err, tail(h.logs.String(), 6000))
	}
}

// outputsAtLeast reports whether n outputs are visible: in the output
// stream, or (core) distinct ones at the subscriber.
func (h *harness) outputsAtLeast(n int) bool {
	if n == 0 {
		return true
	}
	if h.cfg.delivery == "core" {
		h.coreMu.Lock()
		defer h.coreMu.Unlock()
		return len(h.coreGot) >= n
	}
	s, err := h.js.Stream(context.Background(), "COUNTS")
	if err != nil {
		return false
	}
	info, err := s.Info(context.Background())
	return err == nil && int(info.State.Msgs) >= n
}

// outModel is the exact expected output of a job: per key, its output values
// in order.
type outModel struct {
	perKey  map[string][]string
	outputs int // total outputs
	events  int // events the outputs account for: inputs (words for split)
	inputs  int // input data messages read back
	ticks   int // logged processing-time ticks in the input
}

// expected computes the model from the input stream as stored, read back
// with its JetStream timestamps: processing time is ingestion time, pt =
// the largest timestamp so far (ticks included) in DefaultProcTimeResolution
// steps, so processing-time windows and TTLs replay exactly.
func (h *harness) expected() ([]jetstream.Msg, outModel) {
	h.t.Helper()
	c := h.cfg
	in := readStream(h.t, h.js, "EVENTS", int(h.lastSeq))
	res := engine.DefaultProcTimeResolution.Milliseconds()
	ttl := c.ttl.Milliseconds()
	m := outModel{perKey: map[string][]string{}}
	counts := map[string]int{}
	type win struct {
		key   string
		start int64
	}
	windows := map[win]int{}
	expiry := map[string]int64{}
	pt := int64(-1 << 63)
	for _, msg := range in {
		md, err := msg.Metadata()
		if err != nil {
			h.t.Fatal(err)
		}
		tsMs := floorDiv(md.Timestamp.UnixNano(), int64(time.Millisecond))
		pt = max(pt, floorDiv(tsMs, res)*res)
		if msg.Subject() == engine.TickSubject("killed") {
			m.ticks++
			continue
		}
		key := msg.Headers().Get(engine.HeaderKey)
		if key == flushKey {
			continue
		}
		m.inputs++
		switch c.op {
		case opCount:
			counts[key]++
			m.perKey[key] = append(m.perKey[key], strconv.Itoa(counts[key]))
			m.events++
		case opSplit:
			for _, w := range splitWords(string(msg.Data())) {
				counts[w]++
				m.perKey[w] = append(m.perKey[w], strconv.Itoa(counts[w]))
				m.events++
			}
		case opWindowEvent:
			ev, err := strconv.ParseInt(msg.Headers().Get(engine.HeaderTime), 10, 64)
			if err != nil {
				h.t.Fatal(err)
			}
			windows[win{key, floorDiv(ev, c.windowMs) * c.windowMs}]++
			m.events++
		case opWindowProc:
			windows[win{key, floorDiv(pt, c.windowMs) * c.windowMs}]++
			m.events++
		case opDedupe:
			// The marker written at pt expires at pt+ttl; a record at or
			// after the expiry passes again.
			if e, seen := expiry[key]; !seen || pt >= e {
				expiry[key] = pt + ttl
				m.perKey[key] = append(m.perKey[key], string(msg.Data()))
			}
			m.events++
		}
	}
	if len(windows) > 0 {
		ws := make([]win, 0, len(windows))
		for w := range windows {
			ws = append(ws, w)
		}
		// A key's windows close oldest first.
		sort.Slice(ws, func(i, j int) bool { return ws[i].start < ws[j].start })
		for _, w := range ws {
			m.perKey[w.key] = append(m.perKey[w.key], fmt.Sprintf("%d,%d", w.start, windows[w]))
		}
	}
	for _, vs := range m.perKey {
		m.outputs += len(vs)
	}
	return in, m
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// verify checks the invariant against the exact model: every input read
// back; with JetStream delivery, exactly the model's outputs, per key in
// order, gap-free output indexes per key group on the right subjects (and
// window outputs stamped with the window's end - 1); with core delivery,
// every model output at least once and nothing else; for count, every
// key's state equal to its count. It returns the model.
func (h *harness) verify() outModel {
	h.t.Helper()
	defer func() {
		if h.t.Failed() {
			h.t.Logf("cairn logs:\n%s", tail(h.logs.String(), 4000))
		}
	}()
	if h.n == 0 {
		h.t.Fatal("harness: nothing published")
	}
	_, m := h.expected()
	if m.inputs != h.n {
		h.t.Fatalf("input stream holds %d input messages, %d were published", m.inputs, h.n)
	}
	if h.cfg.delivery == "core" {
		h.verifyCore(m)
	} else {
		h.verifyStream(m)
	}
	if h.cfg.op == opCount || h.cfg.op == opSplit {
		checkState(h.t, h.data, h.cfg.keyGroups, h.cfg.slots, h.model)
	}
	return m
}

func (h *harness) verifyStream(m outModel) {
	h.t.Helper()
	out := readStream(h.t, h.js, "COUNTS", m.outputs)
	if len(out) != m.outputs {
		h.t.Errorf("output stream holds %d messages, want exactly %d (the model's, from %d input messages)", len(out), m.outputs, m.inputs)
	}
	lastValues(h.t, out, "counts", h.cfg.keyGroups) // indexes gap-free, subjects right
	got := map[string][]string{}
	for _, msg := range out {
		key := msg.Headers().Get(engine.HeaderKey)
		got[key] = append(got[key], string(msg.Data()))
		if h.cfg.op == opWindowEvent || h.cfg.op == opWindowProc {
			var start, n int64
			if _, err := fmt.Sscanf(string(msg.Data()), "%d,%d", &start, &n); err != nil {
				h.t.Fatalf("window output %q of key %s: %v", msg.Data(), key, err)
			}
			if tm := msg.Headers().Get(engine.HeaderTime); tm != strconv.FormatInt(start+h.cfg.windowMs-1, 10) {
				h.t.Errorf("window %s@%d: output time %s, want the window's end - 1", key, start, tm)
			}
		}
	}
	h.compare(m, got)
}

// compare reports every key whose outputs differ from the model.
func (h *harness) compare(m outModel, got map[string][]string) {
	h.t.Helper()
	var diffs []string
	for k, want := range m.perKey {
		if g := got[k]; !slices.Equal(g, want) {
			diffs = append(diffs, fmt.Sprintf("key %q: %s", k, firstDiff(g, want)))
		}
	}
	for k, g := range got {
		if _, ok := m.perKey[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("key %q is not in the model: %d outputs %q...", k, len(g), g[:min(len(g), 3)]))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		h.t.Errorf("%s: %d of %d keys differ from the model (%d outputs, %d events, %d ticks in the input):\n%s",
			h.cfg.op, len(diffs), len(m.perKey), m.outputs, m.events, m.ticks, strings.Join(diffs[:min(len(diffs), 12)], "\n"))
	}
}

func firstDiff(got, want []string) string {
	for i := range max(len(got), len(want)) {
		if i >= len(got) || i >= len(want) || got[i] != want[i] {
			g, w := "(none)", "(none)"
			if i < len(got) {
				g = got[i]
			}
			if i < len(want) {
				w = want[i]
			}
			return fmt.Sprintf("%d outputs, want %d; first difference at output %d: got %q, want %q", len(got), len(want), i+1, g, w)
		}
	}
	return "equal"
}

// verifyCore checks at-least-once: every output of the model arrived, and
// nothing else did (a replay regenerates the same outputs).
func (h *harness) verifyCore(m outModel) {
	h.t.Helper()
	want := map[[2]string]bool{}
	for k, vs := range m.perKey {
		for _, v := range vs {
			want[[2]string{k, v}] = true
		}
	}
	// The outputs were flushed at the graceful stop; give the subscriber a
	// moment to drain them.
	deadline := time.Now().Add(30 * time.Second)
	for !h.outputsAtLeast(len(want)) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	h.coreMu.Lock()
	defer h.coreMu.Unlock()
	var missing, extra []string
	dups := 0
	for kv := range want {
		if h.coreGot[kv] == 0 {
			missing = append(missing, fmt.Sprintf("%s=%s", kv[0], kv[1]))
		}
	}
	for kv, n := range h.coreGot {
		if !want[kv] {
			extra = append(extra, fmt.Sprintf("%s=%s", kv[0], kv[1]))
		}
		dups += n - 1
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 || len(extra) > 0 {
		h.t.Errorf("core delivery: %d of %d model outputs never arrived %v; %d outputs not in the model %v", len(missing), len(want), missing[:min(len(missing), 10)], len(extra), extra[:min(len(extra), 10)])
	}
	h.t.Logf("core delivery: %d outputs, each at least once (%d repeats)", len(want), dups)
}
