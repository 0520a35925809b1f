package job

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestExamplesParse(t *testing.T) {
	files, err := filepath.Glob("../../../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, f := range files {
		if _, err := Load(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

const good = `
name: wordcount
input:  {stream: LINES, subjects: ["lines.>"]}
stages:
  - {name: split, module: "builtin:split"}
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: COUNTS, subject: counts}
`

func TestDefaults(t *testing.T) {
	j, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if j.NATS != "embedded" || j.KeyGroups != 128 || j.Slots != 1 || j.Output.Delivery != "exactly_once" || j.DataDir != "./cairn-data" {
		t.Fatalf("defaults: %+v", j)
	}
	if j.Restore.Prefetch != "auto" {
		t.Fatalf("restore.prefetch defaults to %q, want auto", j.Restore.Prefetch)
	}
	if j.MaxKeyBytes != 16<<10 || j.Watermark.MaxFutureSkew == nil || j.Watermark.MaxFutureSkew.Off || j.Watermark.MaxFutureSkew.Duration != 5*time.Minute {
		t.Fatalf("bad-input defaults: max_key_bytes %d, max_future_skew %+v", j.MaxKeyBytes, j.Watermark.MaxFutureSkew)
	}
	for _, s := range j.Stages {
		if s.Clock != ClockIngestion {
			t.Fatalf("stage %s: clock %q, want the default %q", s.Name, s.Clock, ClockIngestion)
		}
	}
}

// TestNewFields: the bad-input bounds and the stage clock parse as
// docs/JOBS.md says; clock: wall is accepted where replays need not repeat.
func TestNewFields(t *testing.T) {
	for _, tc := range []struct {
		edit     string
		keyBytes int
		skew     time.Duration
		off      bool
		clock    string
	}{
		{"max_key_bytes: 1", 1, 5 * time.Minute, false, ClockIngestion},
		{"max_key_bytes: 61440", 61440, 5 * time.Minute, false, ClockIngestion},
		{"watermark: {max_future_skew: 30s}", 16 << 10, 30 * time.Second, false, ClockIngestion},
		{"watermark: {max_future_skew: off}", 16 << 10, 0, true, ClockIngestion},
		{"watermark: {max_future_skew: null}", 16 << 10, 5 * time.Minute, false, ClockIngestion},
		{"stages: [{name: c, module: 'builtin:count', keyed: true, clock: wall}]\noutput: {stream: C, subject: counts, delivery: transactional}\ncheckpoint: {interval: 1s}", 16 << 10, 5 * time.Minute, false, ClockWall},
		{"stages: [{name: c, module: 'builtin:count', keyed: true, clock: wall}]\noutput: {subject: counts, delivery: core}", 16 << 10, 5 * time.Minute, false, ClockWall},
		{"stages: [{name: c, module: 'builtin:count', keyed: true, clock: ingestion}]", 16 << 10, 5 * time.Minute, false, ClockIngestion},
	} {
		j, err := Parse([]byte(edit(good, tc.edit)))
		if err != nil {
			t.Errorf("%q: %v", tc.edit, err)
			continue
		}
		s := j.Watermark.MaxFutureSkew
		if j.MaxKeyBytes != tc.keyBytes || s.Duration != tc.skew || s.Off != tc.off || j.Stages[len(j.Stages)-1].Clock != tc.clock {
			t.Errorf("%q: max_key_bytes %d, max_future_skew %+v, clock %q", tc.edit, j.MaxKeyBytes, *s, j.Stages[len(j.Stages)-1].Clock)
		}
	}
}

// TestEmptyFile: an empty job file (or one of only comments) says so,
// with the file's name, instead of the decoder's "EOF".
func TestEmptyFile(t *testing.T) {
	for _, src := range []string{"", "\n  \n", "# nothing yet\n"} {
		path := filepath.Join(t.TempDir(), "job.yaml")
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path)
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("%q: got %v, want a job error", src, err)
		}
		if want := "job file " + path + " is empty"; !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "EOF") {
			t.Errorf("%q: %q, want it to start with %q", src, err, want)
		}
	}
}

// TestGroupSection: a group's defaults, from a job file.
func TestGroupSection(t *testing.T) {
	j, err := Parse([]byte(good + "nats: nats://h:4222\ncheckpoint: {store: 'file:///s'}\ngroup: {}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if g := j.Group; g == nil || g.Members != "auto" || g.LeaseTTL != DefaultGroupLeaseTTL || g.Replicas != 1 {
		t.Fatalf("group defaults: %+v", j.Group)
	}
	j, err = Parse([]byte(good + "nats: nats://h:4222\ncheckpoint: {store: 'file:///s'}\ngroup: {lease_ttl: 3s, replicas: 3}\n"))
	if err != nil || j.Group.LeaseTTL != 3*time.Second || j.Group.Replicas != 3 {
		t.Fatalf("group: %+v, %v", j.Group, err)
	}
}

func TestRejections(t *testing.T) {
	for _, tc := range []struct{ edit, field string }{
		{"key_groups: 40000", "key_groups"},
		{"key_groups: 4\nslots: 5", "slots"},
		{"nats: http://x", "nats"},
		{"output: {stream: C, subject: counts, delivery: maybe}", "output.delivery"},
		{"output: {subject: counts}", "output.stream"},
		{"output: {stream: C, subject: 'counts.>'}", "output.subject"},
		{"checkpoint: {store: 'ftp://x', interval: 1s}", "checkpoint.store"},
		{"checkpoint: {mode: partial}", "checkpoint.mode"},
		{"colour: blue", "(yaml)"},
		{"stages: [{name: a, module: 'builtin:split'}, {name: a, module: 'builtin:split'}]", "stages[1].name"},
		{"stages: [{name: a}]", "stages[0].module"},
		{"stages: [{name: a, module: x, ttl: 1m}]", "stages[0].ttl"},
		{"slots: 0", "slots"},
		{"slots: -1", "slots"},
		{"max_key_bytes: 0", "max_key_bytes"},
		{"max_key_bytes: -5", "max_key_bytes"},
		{"max_key_bytes: 61441", "max_key_bytes"},
		{"max_key_bytes: 70000", "max_key_bytes"},
		{"restore: {mode: online, prefetch: always}", "restore.prefetch"},
		{"watermark: {max_future_skew: 0s}", "watermark.max_future_skew"},
		{"watermark: {max_future_skew: -1m}", "watermark.max_future_skew"},
		{"watermark: {max_future_skew: soon}", "(yaml)"},
		{"stages: [{name: a, module: 'builtin:split', clock: event}]", "stages[0].clock"},
		{"stages: [{name: a, module: 'builtin:split', clock: wall}, {name: c, module: 'builtin:count', keyed: true}]", "stages[0].clock"},
		{"output: {stream: C, subject: counts, delivery: dedupe}\nstages: [{name: c, module: 'builtin:count', keyed: true, clock: wall}]", "stages[0].clock"},
		{"group: {members: auto}", "group"},                      // embedded server
		{"nats: nats://h:4222\ngroup: {members: auto}", "group"}, // no store
		{"nats: nats://h:4222\ncheckpoint: {store: 'file:///s'}\ngroup: {members: 3}", "group.members"},
		{"nats: nats://h:4222\ncheckpoint: {store: 'file:///s'}\ngroup: {lease_ttl: 100ms}", "group.lease_ttl"},
		{"nats: nats://h:4222\ncheckpoint: {store: 'file:///s'}\ngroup: {replicas: 2}", "group.replicas"},
	} {
		_, err := Parse([]byte(edit(good, tc.edit)))
		var je *Error
		if !errors.As(err, &je) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: got %v, want a job error", tc.edit, err)
			continue
		}
		if je.Field != tc.field {
			t.Errorf("%q: error names field %q (%v), want %q", tc.edit, je.Field, err, tc.field)
		}
	}
}

// TestRefusalMessages: the refusals this package adds say what to do.
func TestRefusalMessages(t *testing.T) {
	for _, tc := range []struct{ edit, want string }{
		{"slots: 0", "slots: 0 must be in [1, key_groups=128] (leave slots out for the default 1)"},
		{"max_key_bytes: 0", "leave max_key_bytes out for the default 16384"},
		{"max_key_bytes: 70000", "70000 must be in [1, 61440]"},
		{"stages: [{name: c, module: 'builtin:count', keyed: true, clock: wall}]",
			`stages[0].clock: stage "c" runs on the wall clock`},
		{"stages: [{name: c, module: 'builtin:count', keyed: true, clock: wall}]",
			"use delivery transactional, or drop clock: wall so the stage runs on ingestion time"},
	} {
		_, err := Parse([]byte(edit(good, tc.edit)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want it to contain %q", tc.edit, err, tc.want)
		}
	}
}

// edit replaces the top-level fields that the lines of e set (with their
// indented continuation lines) in src, and appends e.
func edit(src, e string) string {
	keys := map[string]bool{}
	for _, l := range strings.Split(e, "\n") {
		keys[strings.SplitN(l, ":", 2)[0]] = true
	}
	var lines []string
	skip := false
	for _, l := range strings.Split(src, "\n") {
		if k := strings.SplitN(l, ":", 2)[0]; strings.Contains(l, ":") && keys[k] {
			skip = true
			continue
		}
		if skip && strings.HasPrefix(l, "  ") {
			continue
		}
		skip = false
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n") + "\n" + e + "\n"
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("name: x\nstages: [{name: a, module: b, config: {a: [1, 2]}}]"))
	f.Add([]byte(good + "max_key_bytes: 100\nwatermark: {max_out_of_orderness: 1s, max_future_skew: 2m}\n"))
	f.Add([]byte(good + "slots: 0\nwatermark: {max_future_skew: off}\n"))
	f.Add([]byte(edit(strings.Replace(good, "keyed: true}", "keyed: true, clock: wall}", 1), "output: {subject: counts, delivery: core}")))
	f.Add([]byte(strings.Replace(good, "keyed: true}", "keyed: true, clock: wall}", 1)))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		j, err := Parse(b)
		if err == nil {
			if j.Validate() != nil {
				t.Fatal("Parse accepted a job that Validate rejects")
			}
			for i := range j.Stages {
				_ = j.Stages[i].ConfigJSON()
			}
		}
	})
}

func TestScrubFields(t *testing.T) {
	base := "name: j\ninput: {stream: IN, subjects: [\"in.>\"]}\nstages: [{name: c, module: \"builtin:count\", keyed: true}]\noutput: {stream: OUT, subject: out}\ncheckpoint: {interval: 1s, %s}\n"
	for _, ok := range []string{"scrub_rate: 4MiB", "scrub_rate: off", "scrub_every: 1m"} {
		if _, err := Parse([]byte(fmt.Sprintf(base, ok))); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"scrub_rate: fast", "scrub_rate: 0", "scrub_every: -1s"} {
		if _, err := Parse([]byte(fmt.Sprintf(base, bad))); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestMarshalRoundTrip: every example job, written back with Marshal,
// parses to the same Job; so does a Job built as a struct in a test.
func TestMarshalRoundTrip(t *testing.T) {
	files, _ := filepath.Glob("../../../examples/*.yaml")
	var jobs []*Job
	for _, f := range files {
		j, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		j.Dir = ""
		jobs = append(jobs, j)
	}
	skew := &Duration{Off: true}
	jobs = append(jobs, &Job{Name: "built", Input: Input{Stream: "IN", Subjects: []string{"in.>"}},
		Stages:    []Stage{{Name: "w", Module: "builtin:window_count", Keyed: true, Config: map[string]any{"size_ms": 1000, "time": "processing"}, Deadline: &Duration{Duration: time.Second}}},
		Output:    Output{Stream: "OUT", Subject: "out"},
		Watermark: Watermark{MaxFutureSkew: skew}, Checkpoint: &Checkpoint{Store: "file:///tmp/x", Interval: time.Second}})
	for _, j := range jobs {
		b, err := j.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: %v\n%s", j.Name, err, b)
		}
		want := *j
		want.SetDefaults()
		if wb, _ := json.Marshal(want); string(wb) != string(mustJSON(t, back)) {
			t.Errorf("%s: round trip\n got %s\nwant %s", j.Name, mustJSON(t, back), wb)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSubTopologies: a job is cut after every keyed stage that more stages
// follow; a chain with one keyed stage last stays one sub-topology.
func TestSubTopologies(t *testing.T) {
	st := func(spec string) []Stage {
		var s []Stage
		for i, c := range spec {
			s = append(s, Stage{Name: fmt.Sprintf("s%d", i), Keyed: c == 'K'})
		}
		return s
	}
	for spec, want := range map[string]string{
		"SK":    "SK",
		"SSK":   "SSK",
		"S":     "S",
		"SKSK":  "SK|SK",
		"SKK":   "SK|K",
		"KS":    "K|S",
		"SKSKS": "SK|SK|S",
	} {
		j := &Job{Stages: st(spec)}
		var parts []string
		for k, sub := range j.Graph() {
			if f := sub.Targets[0].Feeds; sub.Index != k || len(sub.Targets) != 1 || (f != -1 && f != k+1) {
				t.Errorf("%s: sub-topology %d: index %d targets %+v", spec, k, sub.Index, sub.Targets)
			}
			p := ""
			for _, s := range sub.Stages {
				if s.Keyed {
					p += "K"
				} else {
					p += "S"
				}
			}
			parts = append(parts, p)
		}
		if got := strings.Join(parts, "|"); got != want {
			t.Errorf("%s: sub-topologies %s, want %s", spec, got, want)
		}
	}
	// A wall-clock stage before a repartition stream is refused even with
	// transactional delivery: the stream is written exactly_once.
	_, err := Parse([]byte(`name: g
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: w, module: "builtin:window_count", keyed: true, clock: wall}
  - {name: c, module: "builtin:count", keyed: true}
output: {stream: OUT, subject: out, delivery: transactional}
checkpoint: {interval: 1s}
`))
	if err == nil || !strings.Contains(err.Error(), "stages[0].clock") {
		t.Fatalf("wall clock before a repartition: %v", err)
	}
}

func TestStageSlots(t *testing.T) {
	base := "name: g\ninput: {stream: IN, subjects: [\"in.>\"]}\nkey_groups: 8\nstages:\n  - {name: c, module: \"builtin:count\", keyed: true, %s}\n  - {name: t, module: \"builtin:top_n\", keyed: true}\noutput: {stream: OUT, subject: out}\n"
	if _, err := Parse([]byte(fmt.Sprintf(base, "slots: 3"))); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"slots: 9", "slots: -1"} {
		if _, err := Parse([]byte(fmt.Sprintf(base, bad))); err == nil || !strings.Contains(err.Error(), "stages[0].slots") {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
