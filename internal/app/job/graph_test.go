package job

import (
	"fmt"
	"strings"
	"testing"
)

const graphHead = `name: g
inputs:
  - {name: orders, stream: ORDERS, subjects: ["orders.>"]}
  - {name: payments, stream: PAYMENTS, subjects: ["payments.>"]}
output: {stream: OUT, subject: out}
stages:
`

// describe prints a graph as "k:input|sides>stages->feeds/side" per
// sub-topology.
func describe(subs []SubTopology) string {
	var parts []string
	for _, s := range subs {
		var names []string
		for _, st := range s.Stages {
			names = append(names, st.Name)
		}
		src := s.Input
		if src == "" {
			src = fmt.Sprintf("rp%d", s.Sides)
		}
		var to []string
		for _, t := range s.Targets {
			switch {
			case t.Feeds >= 0:
				to = append(to, fmt.Sprintf("%d/%d", t.Feeds, t.Side))
			case t.Output == "":
				to = append(to, "-1/0")
			default:
				to = append(to, "o:"+t.Output)
			}
			if t.Port > 0 {
				to[len(to)-1] += fmt.Sprintf("@%d", t.Port)
			}
		}
		parts = append(parts, fmt.Sprintf("%d:%s>%s->%s", s.Index, src, strings.Join(names, ","), strings.Join(to, "+")))
	}
	return strings.Join(parts, " ")
}

// TestGraphCuts: two-input stages, sides with and without stages of their
// own, keyed stages after them.
func TestGraphCuts(t *testing.T) {
	for _, c := range []struct{ stages, want string }{
		{ // both sides bare inputs: two forwarding sub-topologies
			`  - {name: join, module: "builtin:interval_join", keyed: true, from: [orders, payments]}
`, "0:orders>->2/0 1:payments>->2/1 2:rp2>join->-1/0"},
		{ // a side with a stateless stage; a keyed stage after the join
			`  - {name: o, module: "builtin:rekey", from: [orders]}
  - {name: join, module: "builtin:interval_join", keyed: true, from: [o, payments]}
  - {name: all, module: "builtin:rekey"}
  - {name: count, module: "builtin:count", keyed: true}
`, "0:orders>o->2/0 1:payments>->2/1 2:rp2>join->3/0 3:rp1>all,count->-1/0"},
		{ // a keyed side: the join is its repartition
			`  - {name: c, module: "builtin:count", keyed: true, from: [payments]}
  - {name: u, module: "builtin:union", from: [orders, c]}
`, "0:payments>c->2/1 1:orders>->2/0 2:rp2>u->-1/0"},
	} {
		j, err := Parse([]byte(graphHead + c.stages))
		if err != nil {
			t.Fatalf("%s: %v", c.stages, err)
		}
		if got := describe(j.Graph()); got != c.want {
			t.Errorf("%s\n got %s\nwant %s", c.stages, got, c.want)
		}
	}
}

// TestGraphPortsAndOutputs: a stage with named ports feeding named outputs
// and another stage; a stage read by two stages (fan-out); each ends its
// sub-topology, with a target per reader.
func TestGraphPortsAndOutputs(t *testing.T) {
	head := `name: g
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: split, module: "builtin:split"}
  - {name: check, module: m, keyed: true, ports: [alerts, metrics]}
  - {name: agg, module: "builtin:count", keyed: true, from: [check.metrics]}
outputs:
  - {name: alerts, from: check.alerts, stream: ALERTS, subject: alerts}
  - {name: totals, from: agg, stream: TOTALS, subject: totals}
  - {name: raw, from: check.metrics, stream: RAW, subject: raw}
`
	j, err := Parse([]byte(head))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := describe(j.Graph()), "0:input>split,check->o:alerts+1/0@1+o:raw@1 1:rp1>agg->o:totals"; got != want {
		t.Errorf("ports:\n got %s\nwant %s", got, want)
	}
	// Fan-out of a stateless stage to two stages and the output.
	j, err = Parse([]byte(`name: g
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: split, module: "builtin:split"}
  - {name: a, module: "builtin:count", keyed: true, from: [split]}
  - {name: b, module: "builtin:dedupe", keyed: true, from: [split]}
outputs:
  - {name: counts, from: a, stream: C, subject: c}
  - {name: firsts, from: b, stream: F, subject: f}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := describe(j.Graph()), "0:input>split->1/0+2/0 1:rp1>a->o:counts 2:rp1>b->o:firsts"; got != want {
		t.Errorf("fan-out:\n got %s\nwant %s", got, want)
	}
	// Several outputs need exactly_once (or core).
	if _, err := Parse([]byte(head + "output: {delivery: dedupe}\n")); err == nil || !strings.Contains(err.Error(), "feeds both another stage") {
		t.Errorf("dedupe with several targets: %v", err)
	}
}

// TestGraphRefusals: each mistake is refused with the field, its line and
// the reason.
func TestGraphRefusals(t *testing.T) {
	for _, c := range []struct{ stages, want string }{
		{`  - {name: a, module: "builtin:split"}
`, "line 7: stages[0].from: required: the job has 2 inputs"},
		{`  - {name: a, module: "builtin:split", from: [orders]}
  - {name: b, module: "builtin:split", from: [nope]}
`, "line 8: stages[1].from[0]: \"nope\" is neither an input"},
		{`  - {name: a, module: "builtin:split", from: [orders, c]}
  - {name: b, module: "builtin:split", from: [a]}
  - {name: c, module: "builtin:split", from: [b]}
`, "the stages form a cycle"},
		{`  - {name: a, module: "builtin:split", from: [orders, payments]}
  - {name: a, module: "builtin:count", keyed: true}
`, "line 8: stages[1].name: duplicate stage name"},
		{`  - {name: a, module: "builtin:split", from: [orders]}
`, "inputs: input \"payments\" is read by no stage"},
		{`  - {name: a, module: "builtin:split", from: [orders]}
  - {name: b, module: "builtin:split", from: [payments]}
`, "stages \"a\", \"b\" are read by no stage"},
		{`  - {name: a, module: "builtin:split", from: [orders]}
  - {name: b, module: "builtin:split", from: [a, payments]}
  - {name: c, module: "builtin:split", from: [a]}
`, "stages \"b\", \"c\" are read by no stage"},
		{`  - {name: a, module: "builtin:split", from: [orders, payments], ports: [x, y]}
  - {name: b, module: "builtin:split", from: [a.x]}
`, "line 7: stages[0].ports[1]: port \"y\" of stage \"a\" is connected to nothing"},
		{`  - {name: a, module: "builtin:split", from: [orders, payments], ports: [x, y]}
  - {name: b, module: "builtin:split", from: [a]}
`, "stages[1].from[0]: stage \"a\" has ports (x, y): name one, like a.x"},
		{`  - {name: a, module: "builtin:split", from: [orders, payments], ports: [x]}
  - {name: b, module: "builtin:split", from: [a.z]}
`, "stage \"a\" has no port \"z\" (it has x)"},
		{`  - {name: a, module: "builtin:split", from: [orders, payments], ports: [x, x]}
`, "duplicate port \"x\""},
		{`  - {name: a, module: "builtin:split", from: [orders, payments, orders]}
`, "reads 3 inputs"},
		{`  - {name: a, module: "builtin:split", from: [orders, orders]}
`, "reads \"orders\" twice"},
	} {
		_, err := Parse([]byte(graphHead + c.stages))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.stages, err, c.want)
		}
	}
	tables := `name: g
inputs:
  - {name: clicks, stream: CLICKS, subjects: ["clicks.>"]}
  - {name: users, table: USERS}
output: {stream: OUT, subject: out}
stages:
`
	j, err := Parse([]byte(tables + "  - {name: enrich, module: \"builtin:lookup_join\", keyed: true, from: [clicks, users]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := describe(j.Graph()), "0:clicks>->2/0 1:users>->2/1 2:rp2>enrich->-1/0"; got != want {
		t.Errorf("lookup join: %s, want %s", got, want)
	}
	for _, c := range []struct{ stages, want string }{
		{"  - {name: e, module: m, from: [users, clicks]}\n", `stages[0].from: table "users" is read by stage "e" otherwise than as the second of two inputs`},
		{"  - {name: a, module: m, from: [clicks]}\n  - {name: b, module: m, from: [users]}\n  - {name: c, module: m, from: [a, b]}\n", `table "users" is read by stage "b"`},
	} {
		if _, err := Parse([]byte(tables + c.stages)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.stages, err, c.want)
		}
	}
	if _, err := Parse([]byte(strings.Replace(tables, "table: USERS", "table: USERS, stream: X", 1) + "  - {name: e, module: m, from: [clicks, users]}\n")); err == nil || !strings.Contains(err.Error(), "inputs[1].table") {
		t.Errorf("table with a stream: %v", err)
	}
	_, err = Parse([]byte("name: g\ninput: {stream: A, subjects: [a]}\ninputs: [{name: x, stream: B, subjects: [b]}]\nstages: [{name: s, module: m}]\noutput: {stream: O, subject: o}\n"))
	if err == nil || !strings.Contains(err.Error(), "input or inputs, not both") {
		t.Errorf("input and inputs: %v", err)
	}
}
