package job

import (
	"errors"
	"strings"
	"testing"
)

// TestEmitLatest: output.emit is all (the default) or latest; latest is
// accepted with transactional delivery only, and never on a job graph,
// and a refusal names the field, its line and the reason.
func TestEmitLatest(t *testing.T) {
	const txn = "output: {stream: C, subject: counts, delivery: transactional, emit: %s}\ncheckpoint: {interval: 1s}"
	for _, tc := range []struct{ edit, want string }{
		{"", ""},
		{"output: {stream: C, subject: counts, emit: all}", "all"},
		{strings.Replace(txn, "%s", "latest", 1), "latest"},
		{strings.Replace(txn, "%s", "all", 1), "all"},
	} {
		j, err := Parse([]byte(edit(good, tc.edit)))
		if err != nil {
			t.Errorf("%q: %v", tc.edit, err)
			continue
		}
		if j.Output.Emit != tc.want {
			t.Errorf("%q: emit %q, want %q", tc.edit, j.Output.Emit, tc.want)
		}
	}
	for _, tc := range []struct{ edit, want string }{
		{"output: {stream: C, subject: counts, emit: latest}", "delivery exactly_once publishes each output before any checkpoint"},
		{"output: {stream: C, subject: counts, delivery: dedupe, emit: latest}\ncheckpoint: {interval: 1s}", "use delivery transactional"},
		{"output: {subject: counts, delivery: core, emit: latest}", "delivery core publishes"},
		{strings.Replace(txn, "%s", "newest", 1), `"newest" must be all or latest`},
	} {
		_, err := Parse([]byte(edit(good, tc.edit)))
		var je *Error
		if !errors.As(err, &je) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: got %v, want a job error", tc.edit, err)
			continue
		}
		if je.Field != "output.emit" || !strings.Contains(je.Reason, tc.want) {
			t.Errorf("%q: %v, want field output.emit and %q", tc.edit, err, tc.want)
		}
	}
	// The refusal points at the emit line.
	_, err := Parse([]byte(`name: c
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: count, module: "builtin:count", keyed: true}
output:
  stream: OUT
  subject: out
  emit: latest
`))
	var je *Error
	if !errors.As(err, &je) || je.Field != "output.emit" || je.Line != 8 {
		t.Errorf("emit latest with exactly_once: %v, want output.emit at line 8", err)
	}
	// A graph: every repartition stream is exactly_once.
	_, err = Parse([]byte(`name: g
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: w, module: "builtin:window_count", keyed: true}
  - {name: c, module: "builtin:count", keyed: true}
output: {stream: OUT, subject: out, delivery: transactional, emit: latest}
checkpoint: {interval: 1s}
`))
	if !errors.As(err, &je) || je.Field != "output.emit" || !strings.Contains(je.Reason, "graph of 2 sub-topologies") {
		t.Errorf("emit latest on a graph: %v", err)
	}
}
