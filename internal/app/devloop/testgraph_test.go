package devloop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// writeRecords writes records as a `cairn test` input file.
func writeRecords(t *testing.T, recs []testRecord) string {
	t.Helper()
	var b bytes.Buffer
	for _, r := range recs {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(line, '\n'))
	}
	f := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(f, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// readOutputs parses `cairn test` output lines.
func readOutputs(t *testing.T, out string) []testOutput {
	t.Helper()
	var outs []testOutput
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var o testOutput
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&o); err != nil {
			t.Fatalf("output line %q: %v", l, err)
		}
		outs = append(outs, o)
	}
	return outs
}

func ptr[T any](v T) *T { return &v }

// TestCairnTestOrderPay runs examples/orderpay.yaml (two inputs, an
// interval join: three sub-topologies) over orders and their payments, as
// e2e's TestJobGraphJoin publishes them, with a restore every 97 records:
// the outputs are exactly the model's pairs (a payment within 10 minutes
// after its order), each once, identical to an uninterrupted run's.
func TestCairnTestOrderPay(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 12))
	const base = int64(1_700_000_000_000)
	var orders, payments []testRecord
	for i := range 240 {
		o := testRecord{Input: "orders", Key: fmt.Sprintf("o%d", i), Value: fmt.Sprintf("order%d", i), Time: ptr(base + int64(i)*1000)}
		orders = append(orders, o)
		for p := range rng.IntN(3) {
			d := int64(rng.IntN(780_000)) - 60_000
			payments = append(payments, testRecord{Input: "payments", Key: o.Key, Value: fmt.Sprintf("pay%d.%d", i, p), Time: ptr(*o.Time + d)})
		}
	}
	sort.SliceStable(payments, func(a, b int) bool { return *payments[a].Time < *payments[b].Time })
	// Rounds of 60 orders and the payments up to 6 minutes after the
	// round's last order, each input in event-time order, the two
	// interleaved at random.
	var recs []testRecord
	for o, p := 0, 0; o < len(orders); {
		end := min(o+60, len(orders))
		upTo := *orders[end-1].Time + 360_000
		if end == len(orders) {
			upTo = 1 << 62
		}
		pEnd := p
		for pEnd < len(payments) && *payments[pEnd].Time <= upTo {
			pEnd++
		}
		ob, pb := orders[o:end], payments[p:pEnd]
		for len(ob) > 0 || len(pb) > 0 {
			if len(pb) == 0 || (len(ob) > 0 && rng.IntN(2) == 0) {
				recs, ob = append(recs, ob[0]), ob[1:]
			} else {
				recs, pb = append(recs, pb[0]), pb[1:]
			}
		}
		o, p = end, pEnd
	}
	want := map[string]int{}
	for _, p := range payments {
		for _, o := range orders {
			if o.Key == p.Key && *p.Time >= *o.Time && *p.Time <= *o.Time+600_000 {
				want[p.Key+"="+o.Value+"|"+p.Value]++
			}
		}
	}
	input := writeRecords(t, recs)
	var out, errb bytes.Buffer
	if err := TestCommand(context.Background(), []string{"--job", "../../../examples/orderpay.yaml", "--input", input, "--restore-every", "97"}, &out, &errb); err != nil {
		t.Fatalf("seed %d: %v\n%s", seed, err, errb.String())
	}
	if !strings.Contains(errb.String(), "outputs identical to an uninterrupted run") {
		t.Fatalf("no restore summary:\n%s", errb.String())
	}
	got := map[string]int{}
	for _, o := range readOutputs(t, out.String()) {
		if o.Output != "" {
			t.Fatalf("output %q: the job has one output", o.Output)
		}
		got[o.Key+"="+o.Value]++
	}
	if !maps.Equal(got, want) {
		for k, n := range want {
			if got[k] != n {
				t.Errorf("%s: %d outputs, want %d", k, got[k], n)
			}
		}
		for k, n := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("%s: %d outputs, want none", k, n)
			}
		}
		t.Fatalf("seed %d: %d outputs, the model has %d", seed, len(got), len(want))
	}
	if strings.Contains(out.String(), `"output"`) {
		t.Fatalf("a job with one output printed an output name:\n%s", out.String())
	}
	t.Logf("%d records, %d pairs exact", len(recs), len(want))
}

// TestCairnTestClicks runs examples/clicks.yaml (a stream and a table
// input, a lookup join) over table rows, clicks, row updates and deletes
// in one file, with a restore every 23 records: each click is joined with
// its user's row as of the click's line (none: dropped), and --state
// prints the table as the file leaves it.
func TestCairnTestClicks(t *testing.T) {
	rows := map[string]string{}
	want := map[string]int{}
	var recs []testRecord
	put := func(user, row string) {
		recs = append(recs, testRecord{Input: "users", Key: user, Value: row})
		rows[user] = row
	}
	del := func(user string) {
		recs = append(recs, testRecord{Input: "users", Key: user, Delete: true})
		delete(rows, user)
	}
	n := 0
	clicks := func(count int) {
		for range count {
			user := fmt.Sprintf("u%d", n%25)
			v := fmt.Sprintf("click%d", n)
			n++
			recs = append(recs, testRecord{Input: "clicks", Key: user, Value: v})
			if row, ok := rows[user]; ok {
				want[user+"="+v+"|"+row]++
			}
		}
	}
	for i := range 20 {
		put(fmt.Sprintf("u%d", i), fmt.Sprintf("name%d.v1", i))
	}
	clicks(60)
	for i := range 5 {
		put(fmt.Sprintf("u%d", i), fmt.Sprintf("name%d.v2", i))
		del(fmt.Sprintf("u%d", 10+i))
	}
	put("u22", "name22.v1")
	clicks(60)
	del("u0")
	put("u10", "name10.v3")
	clicks(30)

	input := writeRecords(t, recs)
	var out, errb bytes.Buffer
	if err := TestCommand(context.Background(), []string{"--job", "../../../examples/clicks.yaml", "--input", input, "--restore-every", "23", "--state"}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	got := map[string]int{}
	state := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if strings.Contains(l, `"stage"`) {
			var s struct{ Stage, Key, Sub, Value string }
			if err := json.Unmarshal([]byte(l), &s); err != nil {
				t.Fatal(err)
			}
			if s.Stage != "enrich" || s.Sub != "" {
				t.Fatalf("state line %s: want stage enrich, sub-key \"\"", l)
			}
			state[s.Key] = s.Value
			continue
		}
		o := readOutputs(t, l)[0]
		got[o.Key+"="+o.Value]++
	}
	if !maps.Equal(got, want) {
		t.Fatalf("joined clicks:\n got %v\nwant %v", got, want)
	}
	if !maps.Equal(state, rows) {
		t.Fatalf("--state: the table is\n%v\nwant\n%v", state, rows)
	}
	t.Logf("%d records: %d joined clicks exact, %d rows", len(recs), len(want), len(rows))
}

// TestCairnTestNamedOutputs runs a keyed stage with two ports feeding two
// named outputs, one port also read by a second keyed stage that feeds
// output: (examples/alerts.yaml with alerts every 3): every line names
// its output, each output is exact, and its own output is an expect file
// it passes, while one changed line fails it.
func TestCairnTestNamedOutputs(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile("../../../examples/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	jobFile := filepath.Join(dir, "alerts.yaml")
	if err := os.WriteFile(jobFile, bytes.Replace(b, []byte("{every: 100}"), []byte("{every: 3}"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	words := strings.Fields("fox dog the cat")
	rng := rand.New(rand.NewPCG(7, 7))
	counts := map[string]int{}
	var recs []testRecord
	for i := range 40 {
		var line []string
		for range 1 + rng.IntN(4) {
			w := words[rng.IntN(len(words))]
			line = append(line, w)
			counts[w]++
		}
		recs = append(recs, testRecord{Key: fmt.Sprintf("l%d", i), Value: strings.Join(line, " ")})
	}
	input := writeRecords(t, recs)
	var out, errb bytes.Buffer
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--restore-every", "9"}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	byOutput := map[string][]testOutput{}
	var order []string
	for _, o := range readOutputs(t, out.String()) {
		if len(order) == 0 || order[len(order)-1] != o.Output {
			if slices.Contains(order, o.Output) {
				t.Fatalf("output %q's lines are not together:\n%s", o.Output, out.String())
			}
			order = append(order, o.Output)
		}
		byOutput[o.Output] = append(byOutput[o.Output], o)
	}
	if want := []string{"", "alerts", "counts"}; !slices.Equal(order, want) {
		t.Fatalf("outputs in the order %q, want %q (output:, then outputs: as the job lists them)", order, want)
	}
	check := func(name string, want map[string]int) {
		t.Helper()
		got := map[string]int{}
		for _, o := range byOutput[name] {
			got[o.Key+"="+o.Value]++
		}
		if !maps.Equal(got, want) {
			t.Errorf("output %q:\n got %v\nwant %v", name, got, want)
		}
	}
	wantCounts, wantAlerts, wantFirst := map[string]int{}, map[string]int{}, map[string]int{}
	for w, c := range counts {
		for n := 1; n <= c; n++ {
			wantCounts[fmt.Sprintf("%s=%d", w, n)]++
			if n%3 == 0 {
				wantAlerts[fmt.Sprintf("%s=%s reached %d", w, w, n)]++
			}
		}
		wantFirst[w+"=1"]++
	}
	check("counts", wantCounts)
	check("alerts", wantAlerts)
	check("", wantFirst)

	expect := filepath.Join(dir, "expect.jsonl")
	os.WriteFile(expect, out.Bytes(), 0o644)
	errb.Reset()
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--expect", expect}, &bytes.Buffer{}, &errb); err != nil {
		t.Fatalf("the run's own output does not match it: %v\n%s", err, errb.String())
	}
	os.WriteFile(expect, bytes.Replace(out.Bytes(), []byte(`{"output":"alerts"`), []byte(`{"output":"counts"`), 1), 0o644)
	errb.Reset()
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--expect", expect}, &bytes.Buffer{}, &errb); err == nil || !strings.Contains(errb.String(), `+ {"output":"alerts"`) {
		t.Fatalf("an expect file with a line on another output passed: %v\n%s", err, errb.String())
	}
}

// TestCairnTestGraphRefusals: a record its job cannot take is refused
// with its file, its line and the reason (a RecordError), before anything
// runs; so is --from-savepoint on a job graph.
func TestCairnTestGraphRefusals(t *testing.T) {
	const op, clicks = "../../../examples/orderpay.yaml", "../../../examples/clicks.yaml"
	ok := `{"input":"orders","key":"o1","value":"v","time":1}`
	for _, c := range []struct {
		name, job, line, want string
	}{
		{"unknown input", op, `{"input":"refunds","key":"o1","value":"v"}`, `unknown input "refunds" (the job's inputs: orders, payments)`},
		{"no input", op, `{"key":"o1","value":"v"}`, `the job has inputs orders, payments: name the record's with "input"`},
		{"delete on a stream", op, `{"input":"orders","key":"o1","delete":true}`, `"delete" removes a table's row, and input "orders" is a stream`},
		{"time on a table row", clicks, `{"input":"users","key":"u1","value":"Ada","time":5}`, `input "users" is a table (KV bucket USERS): a row has no event time`},
		{"a delete with a value", clicks, `{"input":"users","key":"u1","value":"Ada","delete":true}`, `a delete of table "users" has no "value"`},
		{"a tick of an input", op, `{"tick":true,"input":"orders"}`, `a tick moves the processing clock of every sub-topology`},
		{"an unknown field", op, `{"input":"orders","key":"o1","value":"v","side":1}`, `unknown field "side"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			first := ok
			if c.job == clicks {
				first = `{"input":"clicks","key":"u1","value":"v"}`
			}
			input := filepath.Join(t.TempDir(), "in.jsonl")
			os.WriteFile(input, []byte(first+"\n\n"+c.line+"\n"), 0o644)
			err := TestCommand(context.Background(), []string{"--job", c.job, "--input", input}, &bytes.Buffer{}, &bytes.Buffer{})
			var re *RecordError
			if !errors.As(err, &re) {
				t.Fatalf("got %v, want a RecordError", err)
			}
			if re.File != input || re.Line != 3 || !strings.Contains(re.Reason, c.want) {
				t.Fatalf("got %q (line %d), want line 3: %s", err, re.Line, c.want)
			}
		})
	}
	input := filepath.Join(t.TempDir(), "in.jsonl")
	os.WriteFile(input, []byte(ok+"\n"), 0o644)
	err := TestCommand(context.Background(), []string{"--job", op, "--input", input, "--from-savepoint", "sp1", "--store", "file://" + t.TempDir()}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--from-savepoint: job orderpay is a job graph of 3 sub-topologies") {
		t.Fatalf("--from-savepoint on a job graph: %v", err)
	}
}

// TestCairnTestGraphTicks: a tick in the input file reaches every
// sub-topology, so a processing-time window of the second one (after a
// repartition) closes on it; without the tick it stays open.
func TestCairnTestGraphTicks(t *testing.T) {
	dir := t.TempDir()
	jobFile := filepath.Join(dir, "job.yaml")
	os.WriteFile(jobFile, []byte(`name: pt
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: count, module: "builtin:count", keyed: true}
  - {name: all, module: "builtin:rekey", config: {key: all}}
  - {name: win, module: "builtin:window_count", keyed: true, config: {size_ms: 100, time: processing}}
output: {stream: OUT, subject: out, delivery: exactly_once}
key_groups: 16
`), 0o644)
	recs := []testRecord{{Key: "a", Value: "x", TS: ptr(int64(1000))}, {Key: "b", Value: "x", TS: ptr(int64(1010))}, {Key: "a", Value: "x", TS: ptr(int64(1020))}}
	for _, c := range []struct {
		tick bool
		want string
	}{{false, ""}, {true, `{"key_group":8,"index":1,"key":"all","value":"1000,3","time":1099}`}} {
		in := recs
		if c.tick {
			in = append(in, testRecord{Tick: true, TS: ptr(int64(1500))})
		}
		var out, errb bytes.Buffer
		if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", writeRecords(t, in), "--restore-every", "2"}, &out, &errb); err != nil {
			t.Fatalf("%v\n%s", err, errb.String())
		}
		if got := strings.TrimSpace(out.String()); got != c.want {
			t.Errorf("tick %v: outputs %q, want %q", c.tick, got, c.want)
		}
	}
}

// TestCairnTestGraphCatchesMemoryState: an operator that counts in its own
// memory, as the second keyed stage of a graph, passes an uninterrupted
// run; --restore-every finds it out in the downstream's replay.
func TestCairnTestGraphCatchesMemoryState(t *testing.T) {
	dir := t.TempDir()
	wasmFile := filepath.Join(dir, "memcount.wasm")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", wasmFile, "./testdata/memcount")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build memcount: %v\n%s", err, out)
	}
	jobFile := filepath.Join(dir, "job.yaml")
	os.WriteFile(jobFile, []byte(fmt.Sprintf(`name: mem
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: count, module: "builtin:count", keyed: true}
  - {name: mem, module: %q, keyed: true}
output: {stream: OUT, subject: out, delivery: exactly_once}
key_groups: 16
slots: 2
`, wasmFile)), 0o644)
	var recs []testRecord
	for i := range 120 {
		recs = append(recs, testRecord{Key: fmt.Sprintf("k%d", i%7), Value: "v"})
	}
	input := writeRecords(t, recs)
	var out, errb bytes.Buffer
	if err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input}, &out, &errb); err != nil {
		t.Fatalf("an uninterrupted run failed: %v\n%s", err, errb.String())
	}
	if n := len(readOutputs(t, out.String())); n != len(recs) {
		t.Fatalf("%d outputs, want one per record (%d)", n, len(recs))
	}
	errb.Reset()
	err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input, "--restore-every", "40"}, &bytes.Buffer{}, &errb)
	if err == nil || !strings.Contains(errb.String(), "not restore-safe") || !strings.Contains(errb.String(), "sub-topology mem.s1: output") {
		t.Fatalf("memory state in the second sub-topology not caught: %v\n%s", err, errb.String())
	}
	t.Logf("caught: %v", err)
}
