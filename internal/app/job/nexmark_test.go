package job

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestNexmarkExamplesParse(t *testing.T) {
	files, _ := filepath.Glob("../../../examples/nexmark/*.yaml")
	if len(files) == 0 {
		t.Fatal("no examples/nexmark/*.yaml")
	}
	for _, f := range files {
		j, err := Load(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if j.Input.Nexmark == nil || j.Input.Stream != NexmarkStream || !j.Output.Discard || j.Output.Delivery != "core" {
			t.Errorf("%s: input %+v output %+v", f, j.Input, j.Output)
		}
	}
}

func TestNexmarkRefused(t *testing.T) {
	const base = `
name: nx
input: {nexmark: {events: 10}}
stages:
  - {name: q, module: "builtin:nexmark", config: {op: q0}}
output: {discard: true}
`
	for _, tc := range []struct{ from, to, field, reason string }{
		{"input: {nexmark: {events: 10}}", "input: {stream: S, nexmark: {events: 10}}", "input.nexmark", "leave out input.stream"},
		{"{events: 10}", "{events: 10, rate: 2000000000}", "input.nexmark", "rate 2000000000"},
		{"output: {discard: true}", "output: {discard: true, stream: OUT}", "output.discard", "leave out output.stream"},
		{"output: {discard: true}", "output: {discard: true, delivery: exactly_once}", "output.delivery", "leave out delivery"},
		{"input: {nexmark: {events: 10}}", "inputs: [{name: a, nexmark: {events: 10}}]", "inputs[0].nexmark", "only input"},
	} {
		y := strings.Replace(base, tc.from, tc.to, 1)
		_, err := Parse([]byte(y))
		var je *Error
		if !errors.As(err, &je) || je.Field != tc.field || !strings.Contains(je.Reason, tc.reason) {
			t.Errorf("%s: got %v, want field %s with %q", tc.to, err, tc.field, tc.reason)
		}
	}
	if _, err := Parse([]byte(base)); err != nil {
		t.Fatal(err)
	}
}
