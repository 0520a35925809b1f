package engine

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/wasm"
)

// TestDeadLetterMessageFits: whatever the record's headers and payload, its
// dead letter fits the server's max_payload and a 64 KiB header block, and
// carries no publish condition of the producer's.
func TestDeadLetterMessageFits(t *testing.T) {
	const maxPayload = 1 << 20
	big := strings.Repeat("k", 70_000)
	cases := []struct {
		name string
		h    nats.Header
		data []byte
	}{
		{"plain", nats.Header{HeaderKey: {"a"}}, []byte("v")},
		{"conditions", nats.Header{"Nats-Expected-Stream": {"LINES"}, "Nats-Expected-Last-Subject-Sequence": {"1"}, "nats-msg-id": {"x"}}, []byte("v")},
		{"payload at max", nats.Header{HeaderTime: {"bad"}}, make([]byte, maxPayload-20)},
		{"long key", nats.Header{HeaderKey: {big}}, []byte("v")},
		{"many headers", manyHeaders(200, 900), make([]byte, maxPayload)},
		{"own headers", nats.Header{HeaderError: {"earlier"}, HeaderStage: {"x"}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := deadLetterMessage("dlq", tc.h, tc.data, "router", 7, errors.New(strings.Repeat("why ", 2000)), maxPayload)
			hb := headerBytes(m.Header)
			if n := hb + len(m.Data); n > maxPayload {
				t.Fatalf("dead letter of %d bytes exceeds max_payload %d", n, maxPayload)
			}
			if hb > 32<<10 {
				t.Fatalf("header block of %d bytes", hb)
			}
			for k := range m.Header {
				if strings.HasPrefix(strings.ToLower(k), "nats-") {
					t.Errorf("dead letter keeps producer header %s", k)
				}
			}
			if m.Header.Get(HeaderStage) != "router" || m.Header.Get(HeaderSeq) != "7" || m.Header.Get(HeaderError) == "" {
				t.Errorf("reason headers: %v", m.Header)
			}
			if len(m.Data) < len(tc.data) {
				if got := m.Header.Get(HeaderTruncated); got != strconv.Itoa(len(tc.data)) {
					t.Errorf("payload cut to %d of %d bytes, %s = %q", len(m.Data), len(tc.data), HeaderTruncated, got)
				}
			} else if m.Header.Get(HeaderTruncated) != "" {
				t.Errorf("%s set on an uncut payload", HeaderTruncated)
			}
		})
	}
	m := deadLetterMessage("dlq", cases[1].h, nil, "s", 1, errors.New("x"), maxPayload)
	if m.Header.Get(HeaderOrigPrefix+"Nats-Expected-Stream") != "LINES" {
		t.Errorf("producer header not kept as %s*: %v", HeaderOrigPrefix, m.Header)
	}
	m = deadLetterMessage("dlq", cases[3].h, nil, "s", 1, errors.New("x"), maxPayload)
	if m.Header.Get(HeaderTruncatedHeaders) != HeaderKey || len(m.Header.Get(HeaderKey)) != dlValueMax {
		t.Errorf("long key: %s=%q, key of %d bytes", HeaderTruncatedHeaders, m.Header.Get(HeaderTruncatedHeaders), len(m.Header.Get(HeaderKey)))
	}
}

func manyHeaders(n, size int) nats.Header {
	h := nats.Header{}
	for i := range n {
		h[fmt.Sprintf("X-H%d", i)] = []string{strings.Repeat("v", size)}
	}
	return h
}

func TestCheckOutput(t *testing.T) {
	if err := checkOutput([]byte("k"), make([]byte, 1000), 16, 1<<20, "job"); err != nil {
		t.Fatal(err)
	}
	if err := checkOutput(make([]byte, 17), nil, 16, 1<<20, "job"); err == nil || !strings.Contains(err.Error(), "max_key_bytes") {
		t.Fatalf("long key: %v", err)
	}
	if err := checkOutput([]byte("k"), make([]byte, 1<<20), 16, 1<<20, "job"); err == nil || !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("large value: %v", err)
	}
}

func TestMessageFault(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nats.ErrMaxPayload, true},
		{fmt.Errorf("wrapped: %w", &jetstream.APIError{Code: 400, ErrorCode: 10097}), true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10060}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: fenceErrCode}, false}, // a stale writer: fatal
		{&jetstream.APIError{Code: 503, ErrorCode: 10077}, false},
		{nats.ErrTimeout, false},
		{jetstream.ErrStreamNotFound, false},
	} {
		if got := messageFault(tc.err); got != tc.want {
			t.Errorf("messageFault(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestClocksAdmit drives the router's decisions record by record: a key
// over the bound, an event time too far ahead of its ingestion time (one
// such record used to move the watermark to the end of time and make every
// later record late), a late record; the watermark moves only with admitted
// records.
func TestClocksAdmit(t *testing.T) {
	cfg := Config{MaxKeyBytes: 8, MaxFutureSkew: time.Minute, MaxOutOfOrder: time.Second, ProcTimeResolution: 10 * time.Millisecond}
	c := newClocks(math.MinInt64, math.MinInt64, &cfg, nil, nil)
	const now = 1_700_000_000_000
	steps := []struct {
		key    string
		evTime int64
		want   string // "" admitted, else a substring of the reason
	}{
		{"a", now, ""},
		{"toolongkey", now, "max_key_bytes"},
		{"a", math.MaxInt64, "ahead of the record's ingestion time"},
		{"a", now + 61_000, "max_future_skew"},
		{"a", now + 59_000, ""},
		{"a", now + 57_000, "late event"},
		{"a", math.MinInt64, "late event"},
		{"a", now + 58_500, ""},
	}
	for i, s := range steps {
		r := wasm.Record{Seq: uint64(i + 1), Key: []byte(s.key), Time: s.evTime}
		tsMs := c.ingest(now * int64(time.Millisecond))
		err := c.admit(&r, ingested{seq: r.Seq, ts: tsMs, pt: c.pt}, &cfg)
		switch {
		case s.want == "" && err != nil:
			t.Fatalf("step %d: %v", i, err)
		case s.want != "" && (err == nil || !strings.Contains(err.Error(), s.want)):
			t.Fatalf("step %d: err %v, want %q", i, err, s.want)
		}
		if err == nil {
			c.observe(r.Time, cfg.MaxOutOfOrder.Milliseconds())
		}
	}
	if want := int64(now + 59_000 - 1000 - 1); c.wm != want {
		t.Errorf("watermark %d, want %d", c.wm, want)
	}
	// Off: the far future is admitted.
	cfg.MaxFutureSkew = -1
	r := wasm.Record{Key: []byte("a"), Time: math.MaxInt64}
	if err := c.admit(&r, ingested{ts: now}, &cfg); err != nil {
		t.Errorf("max_future_skew off: %v", err)
	}
}

// TestClocksRestore: clocks rebuilt from a checkpoint's values give the
// same watermark as the clocks that wrote them.
func TestClocksRestore(t *testing.T) {
	cfg := Config{MaxOutOfOrder: 250 * time.Millisecond, ProcTimeResolution: 10 * time.Millisecond}
	a := newClocks(math.MinInt64, math.MinInt64, &cfg, nil, nil)
	for _, ts := range []int64{1005, 1017, 999, 2003} {
		a.ingest(ts * int64(time.Millisecond))
		a.observe(ts*3, 250)
	}
	if a.pt != 2000 {
		t.Fatalf("processing clock %d, want 2000 (largest ingestion time in 10 ms steps)", a.pt)
	}
	b := newClocks(a.maxTime, a.pt, &cfg, nil, nil)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("restored clocks %+v, want %+v", *b, *a)
	}
	// The clock never goes back with the server's.
	b.ingest(1500 * int64(time.Millisecond))
	if b.pt != 2000 {
		t.Errorf("clock went back to %d", b.pt)
	}
	if encodeClock(math.MinInt64) != 0 || decodeClock(encodeClock(-5)) != -5 || decodeClock(encodeClock(a.maxTime)) != a.maxTime {
		t.Error("clock encoding does not round-trip")
	}
}

func TestSubjectMatches(t *testing.T) {
	for _, tc := range []struct {
		f, s string
		want bool
	}{
		{">", "cairn.tick.j", true},
		{"cairn.>", "cairn.tick.j", true},
		{"cairn.*.j", "cairn.tick.j", true},
		{"cairn.tick", "cairn.tick.j", false},
		{"lines.>", "cairn.tick.j", false},
		{"cairn.tick.j.>", "cairn.tick.j", false},
		{"cairn.tick.j", "cairn.tick.j", true},
	} {
		if got := SubjectMatches(tc.f, tc.s); got != tc.want {
			t.Errorf("SubjectMatches(%q, %q) = %v", tc.f, tc.s, got)
		}
	}
}

func TestIngestedAt(t *testing.T) {
	ing := []ingested{{seq: 3, ts: 30}, {seq: 5, ts: 50}, {seq: 9, ts: 90}}
	for seq, want := range map[uint64]int64{3: 30, 5: 50, 9: 90} {
		if got := ingestedAt(ing, seq).ts; got != want {
			t.Errorf("seq %d: ts %d, want %d", seq, got, want)
		}
	}
}

// TestUpstreamWatermarkTable: on a repartition input the watermark is the
// least of the upstream key groups' last watermarks; an idle key group
// holds it until its marker arrives; a key group never goes back.
func TestUpstreamWatermarkTable(t *testing.T) {
	const kgs = 5
	none := make([]int64, kgs)
	for i := range none {
		none[i] = math.MinInt64
	}
	cfg := Config{ProcTimeResolution: 10 * time.Millisecond, UpstreamWatermarks: true}
	c := newClocks(math.MinInt64, math.MinInt64, &cfg, none, make([]uint64, len(none)))
	steps := []struct {
		kg   int
		wm   int64
		want int64
	}{
		{0, 100, math.MinInt64}, {1, 200, math.MinInt64}, {2, 50, math.MinInt64}, {3, 300, math.MinInt64},
		{4, 400, 50}, // every key group reported: the least
		{2, 500, 100},
		{0, 90, 100}, // a key group never goes back
		{0, 600, 200},
		{1, 700, 300},
	}
	for i, s := range steps {
		c.upstream(s.kg, s.wm)
		if c.wm != s.want {
			t.Fatalf("step %d: watermark %d, want %d", i, c.wm, s.want)
		}
	}
	// Restored from a snapshot: the same watermark, and the same updates
	// lead to the same results.
	r := newClocks(c.maxTime, c.pt, &cfg, c.up.snapshot(), c.upIdx)
	if r.wm != c.wm {
		t.Fatalf("restored watermark %d, want %d", r.wm, c.wm)
	}
	// observe does not move an upstream watermark.
	r.observe(1_000_000, 0)
	if r.wm != c.wm {
		t.Fatalf("a record's event time moved the upstream watermark to %d", r.wm)
	}
	one := newClocks(math.MinInt64, math.MinInt64, &cfg, []int64{math.MinInt64}, []uint64{0})
	one.upstream(0, 7)
	if one.wm != 7 {
		t.Fatalf("one key group: watermark %d", one.wm)
	}
}

func TestUpstreamMeta(t *testing.T) {
	m := Message{Subject: "cairn.rp.j.1.12", Header: nats.Header{HeaderWatermark: {"-5"}, HeaderMarker: {"wm"}}}
	kg, _, wm, _, marker, err := upstreamMeta(&m, 16, 1)
	if err != nil || kg != 12 || wm != -5 || !marker {
		t.Fatalf("got %d %d %v %v", kg, wm, marker, err)
	}
	for _, bad := range []Message{{Subject: "cairn.rp.j.1.16"}, {Subject: "x.y"}, {Subject: "a.3", Header: nats.Header{HeaderWatermark: {"soon"}}}} {
		if _, _, _, _, _, err := upstreamMeta(&bad, 16, 1); err == nil {
			t.Errorf("%s %v accepted", bad.Subject, bad.Header)
		}
	}
	// Two sides: the side is the token before the key group, and the
	// watermark table has a row per side.
	two := Message{Subject: "cairn.rp.j.2.1.12"}
	if up, side, _, _, _, err := upstreamMeta(&two, 16, 2); err != nil || up != 16+12 || side != 1 {
		t.Fatalf("two sides: %d %d %v", up, side, err)
	}
	for _, bad := range []string{"cairn.rp.j.2.2.12", "cairn.rp.j.2.x.12", "12"} {
		if _, _, _, _, _, err := upstreamMeta(&Message{Subject: bad}, 16, 2); err == nil {
			t.Errorf("two sides: %s accepted", bad)
		}
	}
}

func TestCoversAll(t *testing.T) {
	for _, tc := range []struct {
		filters, subjects []string
		want              bool
	}{
		{[]string{"lines.>", "cairn.tick.j"}, []string{"lines.>", "cairn.tick.j"}, true},
		{[]string{">"}, []string{"a", "b.>"}, true},
		{[]string{"a.>"}, []string{"a.b", "a.c.>"}, true},
		{[]string{"lines.x"}, []string{"lines.>"}, false},
		{[]string{"lines.>"}, []string{"lines.>", "other"}, false},
		{nil, []string{"a"}, false},
	} {
		if got := coversAll(tc.filters, tc.subjects); got != tc.want {
			t.Errorf("coversAll(%v, %v) = %v", tc.filters, tc.subjects, got)
		}
	}
}
