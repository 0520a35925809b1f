package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestCoversAllButForeignTicks(t *testing.T) {
	own := []string{"in.>", TickSubject("a")}
	for _, tc := range []struct {
		filters, subjects []string
		want              bool
	}{
		// another job's tick subject does not keep the filter
		{own, []string{"in.>", TickSubject("a"), TickSubject("b")}, true},
		{own, []string{"in.>", TickSubject("b"), TickSubject("c")}, true},
		// any other subject does
		{own, []string{"in.>", TickSubject("b"), "other"}, false},
		// a filter that takes a tick subject takes it as a record subject
		{[]string{"cairn.>"}, []string{"cairn.>"}, true},
		{nil, []string{"in.>", TickSubject("b")}, false},
	} {
		if got := coversAll(tc.filters, withoutForeignTicks(tc.filters, tc.subjects)); got != tc.want {
			t.Errorf("coversAll(%v, withoutForeignTicks(%v)) = %v", tc.filters, tc.subjects, got)
		}
	}
}

// TestForeignTicksIgnored: a second job on an input stream that holds
// another job's tick subject consumes it unfiltered (the server then reads
// the stream as it is), and the other job's ticks, interleaved with the
// records, have no effect: every count is right, nothing is dead-lettered.
func TestForeignTicksIgnored(t *testing.T) {
	nc := startServer(t)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	other := TickSubject("other")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>", other}}); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	want := map[string]int{}
	for i := range n {
		k := fmt.Sprintf("k%d", i%37)
		want[k]++
		if _, err := js.PublishAsync("in."+k, []byte("x"), jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			if _, err := js.PublishAsync(other, nil, jetstream.WithStallWait(time.Minute)); err != nil {
				t.Fatal(err)
			}
		}
	}
	<-js.PublishAsyncComplete()
	e, err := New(Config{
		Job: "second", KeyGroups: 16, Slots: 2, InputStream: "IN", InputSubjects: []string{"in.>"}, OutputStream: "OUT", OutputSubject: "out",
		Stages:    []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
		DataDir:   t.TempDir(),
		BatchSize: 64,
	}, nc)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(rctx) }()
	in, _ := js.Stream(ctx, "IN")
	info, _ := in.Info(ctx)
	last := info.State.LastSeq
	deadline := time.Now().Add(time.Minute)
	for e.Stats().ProcessedSeq < last && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// The source's consumer has no filter.
	filtered := 0
	for ci := range in.ListConsumers(ctx).Info() {
		if ci.Config.FilterSubject != "" || len(ci.Config.FilterSubjects) > 0 {
			filtered++
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := e.Stats().ProcessedSeq; got < last {
		t.Fatalf("processed through %d, want %d", got, last)
	}
	if filtered > 0 {
		t.Errorf("%d source consumers filter the input: another job's tick subject kept the filter", filtered)
	}
	if d := e.deadLettered.Load(); d != 0 {
		t.Errorf("%d dead letters: another job's ticks reached the job as records", d)
	}
	out, err := js.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	cons, err := out.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		k := m.Headers().Get(HeaderKey)
		got[k]++
		if v := string(m.Data()); v != fmt.Sprint(got[k]) {
			t.Fatalf("output %d of key %s is %s", got[k], k, v)
		}
	}
	for k, c := range want {
		if got[k] != c {
			t.Errorf("key %s: %d outputs, want %d", k, got[k], c)
		}
	}
}
