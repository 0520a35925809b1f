package source

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"cairn/engine"
	"cairn/nexmark"
)

// TestGeneratedConsume: the input from any sequence on is the generator's
// events from there, then nothing until stopped; a Discard counts outputs.
func TestGeneratedConsume(t *testing.T) {
	cfg := nexmark.Config{Seed: 9, Events: 300, Rate: 100}
	gen, err := nexmark.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := &Discard{}
	g := &Generated{Gen: gen, Rest: d}
	p, err := g.Prepare(context.Background(), engine.PrepareRequest{Tick: "cairn.tick.x"})
	if err != nil || p.Tick != nil || p.TickSubject != "" {
		t.Fatalf("Prepare = %+v, %v: a generated input takes no ticks", p, err)
	}
	msgs, stop, done, err := g.Consume(context.Background(), 101, nil)
	if err != nil {
		t.Fatal(err)
	}
	var e nexmark.Event
	for n := uint64(100); n < cfg.Events; n++ {
		m := <-msgs
		gen.Event(n, &e)
		if m.Seq != n+1 || m.TsNanos != e.Time()*int64(time.Millisecond) || string(m.Data) != string(nexmark.AppendJSON(nil, &e)) ||
			m.Subject != "nexmark."+e.Kind.String()+"."+strconv.FormatInt(e.Key(), 10) {
			t.Fatalf("message %d: %+v", n+1, m)
		}
	}
	select {
	case m := <-msgs:
		t.Fatalf("a message after the last event: %+v", m)
	case <-time.After(50 * time.Millisecond):
	}
	stop()
	<-done
	pub, err := g.NewPublisher(0, true, func(error) {}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := pub.Publish(engine.Output{KeyGroup: i, Index: 1, Key: []byte("k")}); err != nil {
			t.Fatal(err)
		}
	}
	_ = pub.Publish(engine.Output{KeyGroup: 0, Marker: true})
	_ = pub.DeadLetter(nil, []byte("x"), "q1", 7, errors.New("bad record"))
	if n, first := d.DeadLetters(); d.Outputs() != 3 || n != 1 || first != "stage q1, input sequence 7: bad record" {
		t.Fatalf("outputs %d, dead letters %d (%q)", d.Outputs(), n, first)
	}
	if last, err := g.LastOutputs(context.Background(), 0); err != nil || len(last) != 0 {
		t.Fatalf("LastOutputs = %v, %v: nothing was published", last, err)
	}
	if _, _, _, err := d.Consume(context.Background(), 1, nil); !errors.Is(err, ErrNoInput) {
		t.Fatalf("Consume of a Discard without input: %v", err)
	}
}
