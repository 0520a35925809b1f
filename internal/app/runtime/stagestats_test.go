package runtime

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cairn/engine"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/job"
	"cairn/internal/testutil/wait"

	"github.com/nats-io/nats.go"
)

// testRecord is a record of these tests: a key, a value and an event time
// in Unix ms.
type testRecord struct {
	Key, Value string
	Time       *int64
}

// testMessages are recs as input messages on the job's input subject, the
// key and event time in their headers; the ingestion time is the event
// time, or the previous one + 1 ms.
func testMessages(j *job.Job, recs []testRecord) []engine.Message {
	subject := strings.NewReplacer("*", "x", ">", "x").Replace(j.InputsOf()[0].Subjects[0])
	msgs := make([]engine.Message, 0, len(recs))
	var ts int64
	for _, r := range recs {
		ts++
		h := nats.Header{engine.HeaderKey: {r.Key}}
		if r.Time != nil {
			ts = max(ts, *r.Time)
			h.Set(engine.HeaderTime, strconv.FormatInt(*r.Time, 10))
		}
		msgs = append(msgs, engine.Message{Subject: subject, TsNanos: ts * int64(time.Millisecond), Header: h, Data: []byte(r.Value)})
	}
	return msgs
}

// stageMetrics runs the job (YAML) over recs on an in-memory log and
// returns its /metrics, scraped once every record is processed, as a
// function of a metric's name and stage.
func stageMetrics(t *testing.T, yaml string, recs []testRecord) func(name, stage string) uint64 {
	t.Helper()
	jobFile := filepath.Join(t.TempDir(), "job.yaml")
	os.WriteFile(jobFile, []byte(yaml), 0o644)
	j, err := job.Load(jobFile)
	if err != nil {
		t.Fatal(err)
	}
	j.DataDir = t.TempDir()
	ml := engine.NewMemLog(0)
	r, err := Start(context.Background(), j, Options{Broker: ml}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ml.Append(testMessages(j, recs)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	wait.For(t, time.Minute, "every record processed", func() bool { return r.Engine.Stats().ProcessedSeq >= uint64(len(recs)) })
	rec := httptest.NewRecorder()
	dashboard.Handler(newObserver(r), dashboard.Options{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	metrics := rec.Body.String()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, "cairn_stage_") {
			t.Log(l)
		}
	}
	return func(name, stage string) uint64 {
		t.Helper()
		for _, l := range strings.Split(metrics, "\n") {
			if stage == "" && strings.HasPrefix(l, name+" ") || stage != "" && strings.HasPrefix(l, name+"{") && strings.Contains(l, `stage="`+stage+`"`) {
				if stage != "" && !strings.Contains(l, `sub_topology="`+j.Name+`"`) {
					t.Fatalf("%s: want the label sub_topology=%q", l, j.Name)
				}
				v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
				if err != nil {
					t.Fatalf("%s: %v", l, err)
				}
				return uint64(v)
			}
		}
		t.Fatalf("no %s of stage %q in /metrics:\n%s", name, stage, metrics)
		return 0
	}
}

// checkStageMetrics compares each (metric, stage) with its count.
func checkStageMetrics(t *testing.T, get func(name, stage string) uint64, want []stageWant) {
	t.Helper()
	for _, w := range want {
		for name, n := range map[string]int{"in": w.in, "out": w.out, "dead_lettered": w.dead} {
			metric := "cairn_stage_records_" + name + "_total"
			if got := get(metric, w.stage); got != uint64(n) {
				t.Errorf("%s{stage=%q} = %d, want %d", metric, w.stage, got, n)
			}
		}
	}
}

type stageWant struct {
	stage         string
	in, out, dead int
}

// wordLines returns n lines of 1-4 words (9 distinct), an event time
// each, a second apart, and the number of words.
func wordLines(n int) (recs []testRecord, words int) {
	for i := range n {
		k := 1 + i%4
		var w []string
		for x := range k {
			w = append(w, fmt.Sprintf("w%d", (i+x)%9))
		}
		recs = append(recs, testRecord{Key: fmt.Sprintf("l%d", i), Value: strings.Join(w, " "), Time: ptr(int64(1_700_000_000_000 + i*1000))})
		words += k
	}
	return recs, words
}

// TestStageMetrics runs two stateless stages (builtin:trap, which fails
// on two records, then split) before a keyed count and reads /metrics:
// the trap's records in are the lines, its dead letters the two that
// failed in it; the split's records in are the other lines, its records
// out their words; the count's records in are the words the router let
// through (a late line's words are the router's dead letters, no stage's),
// its records out one count per word.
func TestStageMetrics(t *testing.T) {
	recs, words := wordLines(60)
	lines := len(recs)
	// Late by a minute (max_out_of_orderness 0): the router dead-letters
	// its three words. And two records the trap stage fails on.
	late := *recs[0].Time
	recs = append(recs, testRecord{Key: "late", Value: "w1 w2 w3", Time: &late})
	recs = append(recs, testRecord{Key: "t1", Value: "TRAP", Time: ptr(late + 70_000)}, testRecord{Key: "t2", Value: "ERR", Time: ptr(late + 70_000)})
	get := stageMetrics(t, `name: wc
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: trap, module: "builtin:trap"}
  - {name: split, module: "builtin:split"}
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: OUT, subject: out, delivery: exactly_once}
key_groups: 16
slots: 2
`, recs)
	checkStageMetrics(t, get, []stageWant{
		{"trap", lines + 3, lines + 1, 2},
		{"split", lines + 1, words + 3, 0},
		{"count", words, words, 0},
	})
	if got := get("cairn_records_dead_lettered_total", ""); got != 5 {
		t.Errorf("cairn_records_dead_lettered_total = %d, want 5", got)
	}
}

// TestStageMetricsKeyedDeadLetters: the keyed stage's dead letters are the
// records that failed in it (builtin:trap as the keyed stage), not the
// router's (a late record): its records in are the records routed to it,
// its records out those less the two it failed on.
func TestStageMetricsKeyedDeadLetters(t *testing.T) {
	recs, _ := wordLines(30)
	n := len(recs)
	next := *recs[n-1].Time + 1000
	recs = append(recs, testRecord{Key: "t1", Value: "TRAP", Time: &next}, testRecord{Key: "t2", Value: "ERR", Time: &next})
	recs = append(recs, testRecord{Key: "late", Value: "w1", Time: recs[0].Time})
	get := stageMetrics(t, `name: kd
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: check, module: "builtin:trap", keyed: true}
output: {stream: OUT, subject: out, delivery: exactly_once}
key_groups: 16
slots: 2
`, recs)
	checkStageMetrics(t, get, []stageWant{{"check", n + 2, n, 2}})
	if got := get("cairn_records_dead_lettered_total", ""); got != 3 {
		t.Errorf("cairn_records_dead_lettered_total = %d, want 3", got)
	}
}

func ptr[T any](v T) *T { return &v }
