package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"cairn/internal/testutil/wait"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestFenceClaimDecision: a claim expects the fence subject's last claim
// (none: an empty subject), and a newer epoch there refuses it.
func TestFenceClaimDecision(t *testing.T) {
	claim := func(epoch string, seq uint64) *jetstream.RawStreamMsg {
		return &jetstream.RawStreamMsg{Subject: "out.fence.claim", Sequence: seq, Header: nats.Header{HeaderEpoch: {epoch}}}
	}
	for _, c := range []struct {
		mine   uint64
		last   *jetstream.RawStreamMsg
		expect uint64
		fenced bool
		bad    bool
	}{
		{mine: 4, last: nil, expect: 0},
		{mine: 4, last: claim("3", 17), expect: 17},
		{mine: 4, last: claim("4", 17), expect: 17}, // its own earlier start
		{mine: 4, last: claim("5", 17), fenced: true},
		{mine: 4, last: claim("x", 17), bad: true},
	} {
		got, err := claimDecision(c.mine, c.last)
		switch {
		case c.fenced:
			if !errors.Is(err, ErrFenced) {
				t.Errorf("epoch %d over %v: %v, want ErrFenced", c.mine, c.last.Header, err)
			}
		case c.bad:
			if err == nil || errors.Is(err, ErrFenced) {
				t.Errorf("epoch %d over %v: %v, want a malformed claim", c.mine, c.last.Header, err)
			}
		case err != nil || got != c.expect:
			t.Errorf("epoch %d: expect %d, %v; want %d", c.mine, got, err, c.expect)
		}
	}
	f := fenceCheck{subject: "out.fence.0"}
	for _, c := range []struct {
		n, checked, acked uint64
		firstSafe         bool
		due               bool
	}{
		{0, 0, 0, true, true},     // a batch's first message
		{0, 0, 0, false, false},   // ... after a batch that ended in a check
		{1, 0, 0, false, false},   // ... until the first message is acknowledged
		{1, 0, 1, false, true},    //
		{5, 1, 5, true, false},    // too soon
		{32, 1, 2, true, true},    // 32 since, a later message acknowledged
		{32, 1, 1, true, false},   // only the check acknowledged: it may still be applied
		{40, 1, 0, true, false},   // the check not acknowledged yet
		{64, 33, 40, true, true},  // the next stride
		{63, 33, 40, true, false}, // one short
	} {
		if got := f.due(c.n, c.checked, c.acked, c.firstSafe); got != c.due {
			t.Errorf("due(n=%d, checked=%d, acked=%d, firstSafe=%v) = %v, want %v", c.n, c.checked, c.acked, c.firstSafe, got, c.due)
		}
	}
	if (&fenceCheck{}).due(0, 0, 0, true) {
		t.Error("an unfenced sink checks")
	}
}

// TestFenceRefusesStaleWriter runs a fenced writer on a real JetStream
// server, lets a newer one claim its output stream, and shows the server
// refuses the old one (ErrFenced) while it still runs, and again when it
// starts anew; the newer writer then makes the outputs whole and exact.
func TestFenceRefusesStaleWriter(t *testing.T) {
	nc := startServer(t)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	const n = 3000
	keys := make([]string, 2*n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", (i*7919)%97)
	}
	inputStream(t, js, keys[:n])
	newEngine := func(epoch uint64) *Engine {
		e, err := New(Config{
			Job: "fenced", KeyGroups: 16, Slots: 2, InputStream: "IN", OutputStream: "OUT", OutputSubject: "out",
			Stages:    []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
			DataDir:   t.TempDir(),
			BatchSize: 50, FenceEpoch: epoch, Logger: quietLogger(),
		}, nc)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	old := newEngine(1)
	done := make(chan error, 1)
	go func() { done <- old.Run(context.Background()) }()
	wait.For(t, time.Minute, "the first writer's outputs", func() bool { return old.Stats().ProcessedSeq >= n })

	st, err := js.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.GetLastMsgForSubject(ctx, claimSubject("out"))
	if err != nil || first.Header.Get(HeaderEpoch) != "1" {
		t.Fatalf("the first writer's claim: %v %v", first, err)
	}
	// A newer owner claims the stream while the old one runs on.
	if _, err := claimFence(ctx, js, "OUT", "out", 2, 1); err != nil {
		t.Fatal(err)
	}
	claim, err := st.GetLastMsgForSubject(ctx, claimSubject("out"))
	if err != nil {
		t.Fatal(err)
	}
	claimSeq := claim.Sequence
	for _, k := range keys[n:] {
		if _, err := js.PublishAsync("in."+k, []byte("x"), jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	select {
	case err := <-done:
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("the stale writer ended with %v, want ErrFenced", err)
		}
		t.Logf("stale writer: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the stale writer was not refused")
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stale := int(info.State.LastSeq - claimSeq)
	for seq := claimSeq + 1; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(HeaderFence) != "" {
			stale-- // the newer writer's marker
			continue
		}
		if m.Header.Get(HeaderEpoch) != "1" {
			t.Fatalf("seq %d after the claim: epoch %q, want the stale writer's 1", seq, m.Header.Get(HeaderEpoch))
		}
	}
	t.Logf("the stale writer stored %d messages after the newer claim (at seq %d), then was refused", stale, claimSeq)

	// Started again under its old epoch, it is refused before it reads.
	if err := newEngine(1).Run(context.Background()); !errors.Is(err, ErrFenced) {
		t.Fatalf("a start under the lost epoch: %v, want ErrFenced", err)
	}

	// A newer owner (epoch 3, with nothing restored) regenerates every
	// output: what the stream holds is skipped by index, the rest follows.
	newer := newEngine(3)
	runUntil(t, newer, uint64(2*n))
	want := map[string]int{}
	for _, k := range keys {
		want[k]++
	}
	checkFencedOutputs(t, js, want)
}

// checkFencedOutputs reads stream OUT: every key group's Cairn-Out runs
// 1, 2, ... without a gap or a repeat, every key's last count is want's,
// and the fence subjects' last messages are the newest claim and its two
// markers.
func checkFencedOutputs(t *testing.T, js jetstream.JetStream, want map[string]int) {
	t.Helper()
	ctx := context.Background()
	cons, err := js.OrderedConsumer(ctx, "OUT", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]uint64{}
	got := map[string]int{}
	fence := map[string]int{}
	last := map[string]string{} // fence subject -> epoch of its last message
	info, _ := js.Stream(ctx, "OUT")
	total := info.CachedInfo().State.Msgs
	for read := uint64(0); read < total; {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			read++
			h := m.Headers()
			if v := h.Get(HeaderFence); v != "" {
				fence[v]++
				last[m.Subject()] = h.Get(HeaderEpoch)
				continue
			}
			idx, _ := strconv.ParseUint(h.Get(HeaderOut), 10, 64)
			if idx != next[m.Subject()]+1 {
				t.Fatalf("%s: Cairn-Out %d after %d", m.Subject(), idx, next[m.Subject()])
			}
			next[m.Subject()] = idx
			got[h.Get(HeaderKey)], _ = strconv.Atoi(string(m.Data()))
		}
	}
	// Three claims (epochs 1, 2, 3), each with a marker per slot (2) and
	// its closing message.
	if fence["claim"] != 3 || fence["marker"] != 6 || fence["claimed"] != 3 {
		t.Errorf("fence messages %v, want 3 claims, 6 markers, 3 closed", fence)
	}
	for subj, ep := range last {
		if ep != "3" {
			t.Errorf("%s: last of epoch %s, want the newest writer's 3", subj, ep)
		}
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("key %s: last count %d, want %d", k, got[k], n)
		}
	}
}

// TestFenceStreamSubjects: a fenced writer whose output stream (made
// outside cairn) cannot hold the fence subjects is refused at start with
// an error that names the stream, its subjects and what it needs.
func TestFenceStreamSubjects(t *testing.T) {
	nc := startServer(t)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	inputStream(t, js, []string{"a", "b"})
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.*"}, AllowBatchPublish: true}); err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{
		Job: "narrow", KeyGroups: 16, InputStream: "IN", OutputStream: "OUT", OutputSubject: "out",
		Stages:  []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
		DataDir: t.TempDir(), FenceEpoch: 2, Logger: quietLogger(),
	}, nc)
	if err != nil {
		t.Fatal(err)
	}
	err = e.Run(ctx)
	if !errors.Is(err, ErrFenceSubjects) || !strings.Contains(err.Error(), "OUT takes [out.*]") || !strings.Contains(err.Error(), "must take out.>") {
		t.Fatalf("a fenced writer on a stream taking out.*: %v, want ErrFenceSubjects naming the stream and out.>", err)
	}
	info, _ := js.Stream(ctx, "OUT")
	if n := info.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("%d messages published before the refusal", n)
	}
}
