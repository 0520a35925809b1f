package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/engine"
)

// TestDedupeOperatorWithTTL runs the builtin dedupe operator with a state
// TTL: a key passes the first time it is seen, repeats within the TTL are
// dropped, and after the TTL the key passes again.
func TestDedupeOperatorWithTTL(t *testing.T) {
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "CLICKS", "clicks.>")
	r, stop := runJob(t, fmt.Sprintf(`
name: firstseen
nats: %s
input:  {stream: CLICKS, subjects: ["clicks.>"]}
stages:
  - {name: first, module: "builtin:dedupe", keyed: true, ttl: 2s}
output: {stream: FIRST, subject: first, delivery: exactly_once}
key_groups: 16
slots: 2
data_dir: %s
`, url, t.TempDir()))
	click := func(keys ...string) []*nats.Msg {
		var msgs []*nats.Msg
		for _, k := range keys {
			msgs = append(msgs, &nats.Msg{Subject: "clicks.x", Header: nats.Header{engine.HeaderKey: []string{k}}, Data: []byte(k)})
		}
		return msgs
	}
	publishAll(t, js, click("a", "b", "a", "c", "b", "a"))
	waitProcessed(t, r.Engine, 6)
	publishAll(t, js, click("a", "c")) // within the TTL: dropped
	waitProcessed(t, r.Engine, 8)
	// The TTL runs on ingestion time, the server's timestamps: real time
	// must pass here. engine/testdata/trace-ttl checks the same decisions
	// with explicit timestamps and no wait, across a crash and a rescale.
	// The TTL is long enough that a loaded machine (2 cores shared with
	// other tests) does not make the repeats above arrive after it.
	time.Sleep(2500 * time.Millisecond)
	publishAll(t, js, click("a", "d", "a"))
	waitProcessed(t, r.Engine, 11)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range readStream(t, js, "FIRST", 5) {
		got = append(got, string(m.Data()))
	}
	// Per key group, outputs keep input order; across groups compare as a multiset.
	want := map[string]int{"a": 2, "b": 1, "c": 1, "d": 1}
	count := map[string]int{}
	for _, k := range got {
		count[k]++
	}
	if fmt.Sprint(count) != fmt.Sprint(want) || len(got) != 5 {
		t.Fatalf("outputs %v (counts %v), want counts %v", got, count, want)
	}
}
