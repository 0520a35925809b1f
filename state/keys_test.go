package state

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"
)

func TestValueKeyRoundTrip(t *testing.T) {
	for _, c := range []struct {
		kg        int
		stage     uint8
		user, sub string
	}{
		{0, 1, "", ""},
		{127, 255, "user", "sub"},
		{MaxKeyGroups - 1, 0, string(make([]byte, 300)), "\xff\x00"},
		{5, 3, "k", ""},
	} {
		b := ValueKey(c.kg, c.stage, []byte(c.user), []byte(c.sub))
		k, err := DecodeKey(b)
		if err != nil {
			t.Fatalf("DecodeKey(ValueKey(%+v)): %v", c, err)
		}
		if k.KeyGroup != c.kg || k.Stage != c.stage || k.Kind != KindValue ||
			string(k.UserKey) != c.user || string(k.Sub) != c.sub {
			t.Fatalf("round trip %+v: got %+v", c, k)
		}
	}
}

// TestValueKeyPinned pins the byte layout of the format (FormatVersion 1).
func TestKeyLayoutPinned(t *testing.T) {
	for _, c := range []struct {
		got  []byte
		want []byte
	}{
		{ValueKey(0x0102, 7, []byte("ab"), []byte("c")), []byte{0x01, 0x02, 7, 1, 2, 'a', 'b', 'c'}},
		{TimerKey(3, 9, DomainProcessingTime, -1, []byte("k")), []byte{0, 3, 9, 2, 1, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 'k'}},
		{TimerKey(3, 9, DomainEventTime, 0, nil), []byte{0, 3, 9, 2, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0}},
		{CounterKey(0x7fff, CounterOutputs), []byte{0x7f, 0xff, 0, 3, 1}},
	} {
		if !bytes.Equal(c.got, c.want) {
			t.Errorf("key %x, want %x", c.got, c.want)
		}
	}
}

func TestTimerKeyRoundTripAndOrder(t *testing.T) {
	times := []int64{math.MinInt64, -1 << 40, -2, -1, 0, 1, 2, 1 << 40, math.MaxInt64}
	var keys [][]byte
	for _, ts := range times {
		for _, user := range []string{"", "a", "b"} {
			b := TimerKey(42, 3, DomainEventTime, ts, []byte(user))
			k, err := DecodeKey(b)
			if err != nil {
				t.Fatalf("DecodeKey(TimerKey(%d, %q)): %v", ts, user, err)
			}
			if k.KeyGroup != 42 || k.Stage != 3 || k.Kind != KindTimer || k.Domain != DomainEventTime ||
				k.Time != ts || string(k.UserKey) != user {
				t.Fatalf("round trip ts=%d user=%q: got %+v", ts, user, k)
			}
			keys = append(keys, b)
		}
	}
	// Generated in (time, user key) order; bytes must sort the same way.
	if !slices.IsSortedFunc(keys, bytes.Compare) {
		t.Fatal("timer keys do not sort by (time, user key)")
	}
	// Event-time timers sort before processing-time timers of the same kg and stage.
	if bytes.Compare(TimerKey(1, 1, DomainEventTime, math.MaxInt64, nil), TimerKey(1, 1, DomainProcessingTime, math.MinInt64, nil)) >= 0 {
		t.Fatal("domains interleave")
	}
	// The same registration is the same key (idempotent).
	if !bytes.Equal(TimerKey(1, 2, 1, 5, []byte("x")), TimerKey(1, 2, 1, 5, []byte("x"))) {
		t.Fatal("timer key not deterministic")
	}
}

func TestCounterKeyRoundTrip(t *testing.T) {
	k, err := DecodeKey(CounterKey(9, CounterOutputs))
	if err != nil {
		t.Fatal(err)
	}
	if k.KeyGroup != 9 || k.Stage != SystemStage || k.Kind != KindCounter || k.Counter != CounterOutputs {
		t.Fatalf("got %+v", k)
	}
}

func TestDecodeKeyRejectsMalformed(t *testing.T) {
	valid := TimerKey(1, 1, 0, 7, []byte("key"))
	for name, b := range map[string][]byte{
		"empty":                 nil,
		"short header":          {0, 1, 1},
		"key group too large":   {0x80, 0, 1, 1, 0},
		"unknown kind 0":        {0, 1, 1, 0},
		"unknown kind 4":        {0, 1, 1, 4, 0},
		"value no length":       {0, 1, 1, 1},
		"value length past end": {0, 1, 1, 1, 5, 'a', 'b'},
		"value bad varint":      {0, 1, 1, 1, 0x80},
		"value long varint":     {0, 1, 1, 1, 0x81, 0x00, 'a'},
		"timer short":           {0, 1, 1, 2, 0, 1, 2},
		"timer bad domain":      append([]byte{0, 1, 1, 2, 2}, valid[5:]...),
		"timer truncated user":  valid[:len(valid)-1],
		"timer trailing bytes":  append(slices.Clone(valid), 'x'),
		"timer no user length":  valid[:headerLen+timerFixed],
		"counter user stage":    {0, 1, 1, 3, 1},
		"counter no id":         {0, 1, 0, 3},
		"counter long":          {0, 1, 0, 3, 1, 2},
	} {
		if _, err := DecodeKey(b); !errors.Is(err, ErrCorruptKey) {
			t.Errorf("%s: DecodeKey(%x) = %v, want ErrCorruptKey", name, b, err)
		} else if !IsCorruption(err) {
			t.Errorf("%s: IsCorruption false", name)
		}
	}
}

func TestKeyGroupSpan(t *testing.T) {
	for _, r := range []KeyGroupRange{{0, 0}, {3, 7}, {0, MaxKeyGroups - 1}, {255, 256}, {MaxKeyGroups - 1, MaxKeyGroups - 1}} {
		start, end := KeyGroupSpan(r)
		in := func(b []byte) bool { return bytes.Compare(b, start) >= 0 && bytes.Compare(b, end) < 0 }
		for _, kg := range []int{r.First, r.Last, (r.First + r.Last) / 2} {
			for _, b := range [][]byte{
				ValueKey(kg, 0, nil, nil),
				ValueKey(kg, 255, bytes.Repeat([]byte{0xff}, 20), []byte{0xff}),
				TimerKey(kg, 255, DomainProcessingTime, math.MaxInt64, []byte{0xff}),
				CounterKey(kg, 255),
			} {
				if !in(b) {
					t.Errorf("span %v: key %x of kg %d outside [%x, %x)", r, b, kg, start, end)
				}
			}
		}
		for _, kg := range []int{r.First - 1, r.Last + 1} {
			if kg < 0 || kg >= MaxKeyGroups {
				continue
			}
			for _, b := range [][]byte{
				ValueKey(kg, 0, nil, nil),
				ValueKey(kg, 255, bytes.Repeat([]byte{0xff}, 20), []byte{0xff}),
				CounterKey(kg, 0),
			} {
				if in(b) {
					t.Errorf("span %v: key %x of kg %d inside [%x, %x)", r, b, kg, start, end)
				}
			}
		}
	}
	if s, e := KeyGroupSpan(KeyGroupRange{First: 4, Last: 3}); !bytes.Equal(s, e) {
		t.Errorf("empty range gives non-empty span [%x, %x)", s, e)
	}
}

func FuzzDecodeKey(f *testing.F) {
	f.Add(ValueKey(1, 2, []byte("user"), []byte("sub")))
	f.Add(TimerKey(3, 4, DomainProcessingTime, -99, []byte("k")))
	f.Add(CounterKey(5, CounterOutputs))
	f.Add([]byte{0, 1, 1, 1, 0x81, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := DecodeKey(b)
		if err != nil {
			if !errors.Is(err, ErrCorruptKey) {
				t.Fatalf("DecodeKey(%x): untyped error %v", b, err)
			}
			return
		}
		// A key that decodes has exactly one spelling: re-encoding gives it back.
		var re []byte
		switch k.Kind {
		case KindValue:
			re = ValueKey(k.KeyGroup, k.Stage, k.UserKey, k.Sub)
		case KindTimer:
			re = TimerKey(k.KeyGroup, k.Stage, k.Domain, k.Time, k.UserKey)
		case KindCounter:
			re = CounterKey(k.KeyGroup, k.Counter)
		default:
			t.Fatalf("DecodeKey(%x) accepted kind %v", b, k.Kind)
		}
		if !bytes.Equal(re, b) {
			t.Fatalf("DecodeKey(%x) = %+v re-encodes to %x", b, k, re)
		}
	})
}
