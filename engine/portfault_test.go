package engine

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/wasm"
)

// badPortOp emits every record to port 0, except a record whose value is
// "bad", which it emits to port 1 (the stage has one): a fault after valid
// emits of the same call.
type badPortOp struct{}

func (badPortOp) Process(_ context.Context, b *wasm.Batch, _ wasm.State) (*wasm.Output, error) {
	out := &wasm.Output{}
	for i, r := range b.Records {
		e := wasm.Emit{Key: r.Key, Value: r.Value, Time: r.Time, Input: i}
		if string(r.Value) == "bad" {
			e.Port = 1
		}
		out.Emits = append(out.Emits, e)
	}
	return out, nil
}

func (badPortOp) Close(context.Context) error { return nil }

// TestEmitToUnknownPortLeavesNoGap: a call that emits valid outputs and
// then one to a port the stage does not have is an operator fault; the
// record-by-record retry publishes the valid ones and dead-letters the
// other, and every key group's Cairn-Out is still 1, 2, 3, ... (the fault
// used to come after the earlier emits had taken their indices).
func TestEmitToUnknownPortLeavesNoGap(t *testing.T) {
	nc := startServer(t)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 400
	bad := map[int]bool{50: true, 190: true, 333: true}
	for i := range n {
		v := "x"
		if bad[i] {
			v = "bad"
		}
		if _, err := js.PublishAsync(fmt.Sprintf("in.k%d", i%13), []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	e, err := New(Config{
		Job: "ports", KeyGroups: 8, Slots: 2, InputStream: "IN", OutputStream: "OUT", OutputSubject: "out",
		Stages:    []Stage{{Name: "op", Keyed: true, New: func(context.Context, int) (Operator, error) { return badPortOp{}, nil }}},
		DataDir:   t.TempDir(),
		BatchSize: 64,
	}, nc)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, e, n)
	if st := e.Stats(); st.DeadLetters != 3 {
		t.Fatalf("dead letters %d, want the 3 records emitted to port 1", st.DeadLetters)
	}
	cons, err := js.OrderedConsumer(ctx, "OUT", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]uint64{}
	for i := 0; i < n-len(bad); i++ {
		m, err := cons.Next()
		if err != nil {
			t.Fatalf("output %d: %v", i, err)
		}
		idx, err := strconv.ParseUint(m.Headers().Get(HeaderOut), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if want := last[m.Subject()] + 1; idx != want {
			t.Fatalf("subject %s: Cairn-Out %d after %d: a gap", m.Subject(), idx, last[m.Subject()])
		}
		last[m.Subject()] = idx
	}
}
