package job

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestExamplesParse(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
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
		{"stages: [{name: count, module: 'builtin:count', keyed: true}, {name: split, module: 'builtin:split'}]", "stages[0].keyed"},
		{"stages: [{name: a, module: 'builtin:split'}, {name: a, module: 'builtin:split'}]", "stages[1].name"},
		{"stages: [{name: a}]", "stages[0].module"},
		{"stages: [{name: a, module: x, ttl: 1m}]", "stages[0].ttl"},
	} {
		src := good
		key := strings.SplitN(tc.edit, ":", 2)[0]
		var lines []string
		skip := false
		for _, l := range strings.Split(src, "\n") {
			if strings.HasPrefix(l, key+":") {
				skip = true
				continue
			}
			if skip && strings.HasPrefix(l, "  ") {
				continue
			}
			skip = false
			lines = append(lines, l)
		}
		src = strings.Join(lines, "\n") + "\n" + tc.edit + "\n"
		_, err := Parse([]byte(src))
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

func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("name: x\nstages: [{name: a, module: b, config: {a: [1, 2]}}]"))
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
