package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/wasm"
)

// lateProbe is a keyed operator that shows what the slot hands it: an
// on-time record emits "rec t=<time>"; a late one (at or before its call's
// watermark) emits "late t=<time> wm=<call watermark> n=<records in the
// call>" and sets an event timer at its own time, behind the watermark; a
// timer emits "timer t=<time>".
type lateProbe struct{}

func (lateProbe) Process(_ context.Context, b *wasm.Batch, _ wasm.State) (*wasm.Output, error) {
	out := &wasm.Output{}
	for i, r := range b.Records {
		v := fmt.Sprintf("rec t=%d", r.Time)
		if r.Time <= b.Watermark {
			v = fmt.Sprintf("late t=%d wm=%d n=%d", r.Time, b.Watermark, len(b.Records))
			out.Timers = append(out.Timers, wasm.TimerOp{Key: r.Key, Time: r.Time, Domain: wasm.EventTime})
		}
		out.Emits = append(out.Emits, wasm.Emit{Key: r.Key, Value: []byte(v), Time: r.Time, Input: i})
	}
	for i, tm := range b.Timers {
		out.Emits = append(out.Emits, wasm.Emit{Key: tm.Key, Value: fmt.Appendf(nil, "timer t=%d", tm.Time), Time: tm.Time, Input: -1, Timer: i})
	}
	return out, nil
}

func (lateProbe) Close(context.Context) error { return nil }

// lateJob runs the probe over times (all of key k, ingested at 1000 ms +
// their position) with max_out_of_orderness 100 ms and the given allowed
// lateness. oneByOne appends each message only after the one before it was
// processed, so every record comes in a pipeline batch of its own;
// otherwise they are appended at once. It returns the outputs' values in
// order and the dead letters as "time: reason".
func lateJob(t *testing.T, lateness time.Duration, oneByOne bool, times ...int64) (outs, dead []string) {
	t.Helper()
	b := NewMemLog(0)
	cfg := Config{
		Job: "late", KeyGroups: 8, Slots: 1,
		InputStream: "IN", InputSubjects: []string{"in.>"},
		Stages:       []Stage{{Name: "probe", Keyed: true, New: func(context.Context, int) (Operator, error) { return lateProbe{}, nil }}},
		OutputStream: "OUT", OutputSubject: "out",
		DataDir: t.TempDir(), BatchSize: 64,
		MaxOutOfOrder:   100 * time.Millisecond,
		AllowedLateness: lateness,
		Logger:          quietLogger(),
		Now:             func() time.Time { return time.Unix(0, 0) },
		// No idle ticks, no sweeps: nothing but the input moves the job.
		ProcessingTimerInterval: time.Hour,
		TTLSweepInterval:        time.Hour,
	}
	e, err := NewWithBroker(cfg, b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}()
	wait := func() {
		want := b.LastSeq()
		deadline := time.Now().Add(10 * time.Second)
		for e.Stats().ProcessedSeq < want {
			if time.Now().After(deadline) {
				t.Fatalf("input not processed through seq %d", want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	var msgs []Message
	for i, tm := range times {
		msgs = append(msgs, Message{
			Subject: "in.k", Header: nats.Header{HeaderTime: {strconv.FormatInt(tm, 10)}},
			Data: []byte("v"), TsNanos: int64(1000+i) * int64(time.Millisecond),
		})
	}
	if oneByOne {
		for _, m := range msgs {
			b.Append(m)
			wait()
		}
	} else {
		b.Append(msgs...)
		wait()
	}
	for _, kgOuts := range b.Outputs() {
		for _, o := range kgOuts {
			if !o.Marker {
				outs = append(outs, o.Value)
			}
		}
	}
	for _, m := range b.DeadLetters() {
		if m.Header.Get(HeaderStage) != "router" {
			t.Errorf("dead letter of stage %q, want router", m.Header.Get(HeaderStage))
		}
		dead = append(dead, m.Header.Get(HeaderTime)+": "+m.Header.Get(HeaderError))
	}
	return outs, dead
}

// TestAllowedLatenessAdmission: with max_out_of_orderness 100 ms the
// watermark after 1200 is 1099. With allowed_lateness 50 ms the router
// admits 1060 (late, but after 1099 - 50), which reaches the keyed stage in
// a call of its own at the watermark it was routed at, and whose timer
// behind the watermark fires right after it; 1049 (not after 1049) is a
// dead letter; the admitted late record does not move the watermark (1210
// is routed at 1099 and moves it to 1109, so 1080 is late too, and 1300 is
// routed at 1109). The outputs are the same whatever the batch boundaries.
func TestAllowedLatenessAdmission(t *testing.T) {
	times := []int64{1000, 1200, 1060, 1049, 1210, 1080, 1300}
	want := []string{
		"rec t=1000", "rec t=1200",
		"late t=1060 wm=1099 n=1", "timer t=1060",
		"rec t=1210",
		"late t=1080 wm=1109 n=1", "timer t=1080",
		"rec t=1300",
	}
	for _, oneByOne := range []bool{false, true} {
		t.Run(fmt.Sprintf("oneByOne=%v", oneByOne), func(t *testing.T) {
			outs, dead := lateJob(t, 50*time.Millisecond, oneByOne, times...)
			if strings.Join(outs, "|") != strings.Join(want, "|") {
				t.Errorf("outputs:\n got %q\nwant %q", outs, want)
			}
			if len(dead) != 1 || !strings.HasPrefix(dead[0], "1049: engine: late event: time 1049 is 50 ms behind the watermark 1099") ||
				!strings.Contains(dead[0], "allowed_lateness 50 ms") {
				t.Errorf("dead letters %q, want 1049 late beyond the allowed lateness", dead)
			}
		})
	}
}

// TestAllowedLatenessZero: without allowed lateness every late record is a
// dead letter with today's reason, and no record reaches the stage late.
func TestAllowedLatenessZero(t *testing.T) {
	outs, dead := lateJob(t, 0, false, 1000, 1200, 1060, 1099, 1100)
	if want := "rec t=1000|rec t=1200|rec t=1100"; strings.Join(outs, "|") != want {
		t.Errorf("outputs %q, want %q", outs, want)
	}
	want := []string{
		"1060: engine: late event: time 1060 is 39 ms behind the watermark 1099 (max_out_of_orderness 100 ms)",
		"1099: engine: late event: time 1099 is 0 ms behind the watermark 1099 (max_out_of_orderness 100 ms)",
	}
	if strings.Join(dead, "|") != strings.Join(want, "|") {
		t.Errorf("dead letters:\n got %q\nwant %q", dead, want)
	}
}

// TestAllowedLatenessConfig: a negative allowed lateness is refused.
func TestAllowedLatenessConfig(t *testing.T) {
	cfg := Config{
		Job: "late", InputStream: "IN", OutputStream: "OUT", OutputSubject: "out", DataDir: t.TempDir(),
		Stages:          []Stage{{Name: "probe", Keyed: true, New: func(context.Context, int) (Operator, error) { return lateProbe{}, nil }}},
		AllowedLateness: -time.Second,
	}
	_, err := NewWithBroker(cfg, NewMemLog(0))
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "watermark.allowed_lateness") {
		t.Fatalf("negative allowed lateness: %v", err)
	}
}

// TestClocksAdmitLateness: the router's decision at the edges, on the
// job's input and on a repartition input (the upstream's watermark), where
// the same allowed lateness applies: what the upstream admitted, and a
// window's late firings (at most its end + lateness behind), stay admitted.
func TestClocksAdmitLateness(t *testing.T) {
	for _, tc := range []struct {
		t, wm, lateness int64
		late            bool
	}{
		{1000, 999, 0, false},
		{999, 999, 0, true},
		{999, 999, 1, false},
		{950, 999, 50, false},
		{949, 999, 50, true},
		{math.MinInt64, math.MaxInt64, math.MaxInt64, true},
		{0, math.MaxInt64, math.MaxInt64, true},
		{1, math.MaxInt64, math.MaxInt64, false},
		{math.MinInt64, math.MinInt64, 1 << 40, false},
		{5, math.MinInt64, 0, false},
	} {
		if got := tooLate(tc.t, tc.wm, tc.lateness); got != tc.late {
			t.Errorf("tooLate(%d, wm %d, lateness %d) = %v, want %v", tc.t, tc.wm, tc.lateness, got, tc.late)
		}
	}

	cfg := Config{MaxKeyBytes: 8, MaxFutureSkew: -1, ProcTimeResolution: 10 * time.Millisecond, UpstreamWatermarks: true, AllowedLateness: 30 * time.Millisecond}
	c := newClocks(math.MinInt64, math.MinInt64, &cfg, []int64{math.MinInt64, math.MinInt64}, []uint64{0, 0})
	c.upstream(0, 500)
	c.upstream(1, 400) // the watermark is the least: 400
	for _, s := range []struct {
		t    int64
		want bool
	}{{401, true}, {400, true}, {371, true}, {370, false}, {100, false}} {
		r := wasm.Record{Key: []byte("a"), Time: s.t}
		err := c.admit(&r, ingested{ts: 1000}, &cfg)
		if (err == nil) != s.want {
			t.Errorf("upstream watermark 400, allowed lateness 30 ms: time %d: %v, want admitted %v", s.t, err, s.want)
		}
	}
}

// TestUpstreamRepeatSkipped: a repartition message is checked against the
// highest Cairn-Out read of its upstream key group: at or below it, a
// record is a repeat (a marker never is); above the next index, the
// outputs between are missing from the stream, which the reader reports
// (a diagnosis of a lost publish; it still processes the message).
func TestUpstreamRepeatSkipped(t *testing.T) {
	cfg := Config{KeyGroups: 2}
	c := newClocks(math.MinInt64, math.MinInt64, &cfg, []int64{math.MinInt64, math.MinInt64}, []uint64{0, 0})
	for i, s := range []struct {
		up      int
		idx     uint64
		marker  bool
		repeat  bool
		skipped uint64
		what    string
	}{
		{0, 3, false, false, 0, "first read: nothing known before it"},
		{0, 4, false, false, 0, "the next output"},
		{0, 4, true, false, 0, "a marker repeating the last"},
		{0, 4, false, true, 0, "a record repeating the last"},
		{0, 7, false, false, 2, "outputs 5 and 6 missing"},
		{0, 9, true, false, 2, "a marker after 7 saying 9: 8 and 9 missing"},
		{1, 1, false, false, 0, "another key group, its own count"},
		{1, 0, false, false, 0, "no index: not checked"},
		{1, 2, false, false, 0, "after an unchecked message"},
	} {
		repeat, skipped := c.upstreamRepeat(s.up, s.idx, s.marker)
		if repeat != s.repeat || skipped != s.skipped {
			t.Errorf("step %d (%s): repeat %v skipped %d, want %v %d", i, s.what, repeat, skipped, s.repeat, s.skipped)
		}
	}
}
