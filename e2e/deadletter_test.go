package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"cairn/engine"
	"cairn/internal/app/runtime"
)

const trapJob = `
name: traps
nats: %s
input:  {stream: IN, subjects: ["in.>"]}
stages:
  - {name: guard, module: "builtin:trap", deadline: 500ms, memory: 64MiB}
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: OUT, subject: out, delivery: exactly_once}
key_groups: 32
slots: 2
data_dir: %s
batch_size: 50
max_message_bytes: 1000
`

// TestDeadLetters: a trapping operator, an infinite loop (deadline), runaway
// memory (limit), unbounded recursion, a filesystem access that is not
// granted, malformed headers and an oversized message each land in the
// dead-letter stream with the reason headers; the instance is replaced, the
// host survives, and processing continues with exact counts (a failed
// record changes no state).
func TestDeadLetters(t *testing.T) {
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "IN", "in.>")
	model := map[string]int{}
	var msgs []*nats.Msg
	bad := map[uint64]string{} // seq -> expected stage
	for i := range 500 {
		seq := uint64(i + 1)
		key := fmt.Sprintf("k%d", i%17)
		m := &nats.Msg{Subject: "in." + key, Data: []byte("v"), Header: nats.Header{}}
		switch i {
		case 100, 333:
			m.Data = []byte("TRAP")
			bad[seq] = "guard"
		case 200:
			m.Header.Set(engine.HeaderTime, "yesterday")
			bad[seq] = "source"
		case 201:
			m.Data = []byte(strings.Repeat("x", 2000))
			bad[seq] = "source"
		case 202:
			m.Header[engine.HeaderKey] = []string{"a", "b"} // two keys: malformed
			bad[seq] = "source"
		case 250:
			m.Data = []byte("LOOP") // stopped by the deadline
			bad[seq] = "guard"
		case 260:
			m.Data = []byte("OOM") // stopped by the memory limit
			bad[seq] = "guard"
		case 270:
			m.Data = []byte("DEEP") // unbounded recursion
			bad[seq] = "guard"
		case 280:
			m.Data = []byte("FS") // no filesystem granted
			bad[seq] = "guard"
		default:
			model[key]++
		}
		msgs = append(msgs, m)
	}
	publishAll(t, js, msgs)
	r, stop := runJob(t, fmt.Sprintf(trapJob, url, t.TempDir()))
	waitProcessed(t, r.Engine, uint64(len(msgs)))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dl := readStream(t, js, "CAIRN_DLQ_TRAPS", len(bad))
	if len(dl) != len(bad) {
		t.Fatalf("dead letters: %d, want %d", len(dl), len(bad))
	}
	for _, m := range dl {
		seq, _ := strconv.ParseUint(m.Headers().Get(engine.HeaderSeq), 10, 64)
		stage := m.Headers().Get(engine.HeaderStage)
		if bad[seq] != stage {
			t.Errorf("dead letter seq %d from stage %q, want %q", seq, stage, bad[seq])
		}
		if m.Headers().Get(engine.HeaderError) == "" {
			t.Errorf("dead letter seq %d has no %s", seq, engine.HeaderError)
		}
		t.Logf("dead letter seq %d stage %s: %s", seq, stage, m.Headers().Get(engine.HeaderError))
	}
	checkOutputs(t, js, "OUT", "out", 32, model)
}

// TestBadModulesRefused: random bytes as a module and a module over the size
// limit are refused before anything starts, with the field named.
func TestBadModulesRefused(t *testing.T) {
	url := startNATS(t)
	dir := t.TempDir()
	random := filepath.Join(dir, "random.wasm")
	b := make([]byte, 4096)
	for i := range b {
		b[i] = byte(i*7919 + i/13)
	}
	if err := os.WriteFile(random, b, 0o644); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.wasm")
	if err := os.WriteFile(huge, append([]byte("\x00asm\x01\x00\x00\x00"), make([]byte, 40<<20)...), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{{random, "stages[0].module"}, {huge, "stages[0].module"}} {
		yaml := fmt.Sprintf(`
name: bad
nats: %s
input: {stream: IN, subjects: ["in.>"]}
stages: [{name: op, module: "%s"}]
output: {stream: OUT, subject: out}
data_dir: %s
`, url, tc.file, t.TempDir())
		_, err := startJob(t, yaml, runtime.Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: got %v, want an error naming %s", filepath.Base(tc.file), err, tc.want)
		}
		t.Logf("%s: %v", filepath.Base(tc.file), err)
	}
}
