package engine

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestDecodeEnvelope(t *testing.T) {
	ts := time.UnixMilli(1234)
	for _, tc := range []struct {
		subject string
		h       nats.Header
		data    string
		key     string
		time    int64
		bad     bool
	}{
		{"lines.abc", nil, "x", "abc", 1234, false},
		{"lines.abc", nats.Header{HeaderKey: {"k"}}, "x", "k", 1234, false},
		{"lines.abc", nats.Header{HeaderTime: {"99"}}, "x", "abc", 99, false},
		{"lines.abc", nats.Header{HeaderTime: {"-5"}}, "x", "abc", -5, false},
		{"lines.abc", nats.Header{HeaderTime: {"soon"}}, "x", "", 0, true},
		{"lines.abc", nats.Header{HeaderKey: {""}}, "x", "", 0, true},
		{"lines.abc", nats.Header{HeaderKey: {"a", "b"}}, "x", "", 0, true},
		{"lines.", nil, "x", "", 0, true},
		{"lines.abc", nil, "toolong", "", 0, true},
	} {
		key, tm, err := decodeEnvelope(tc.subject, tc.h, []byte(tc.data), ts, 5)
		if tc.bad {
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("%s %v: want ErrMalformed, got %v", tc.subject, tc.h, err)
			}
			continue
		}
		if err != nil || string(key) != tc.key || tm != tc.time {
			t.Errorf("%s %v: got (%q, %d, %v), want (%q, %d)", tc.subject, tc.h, key, tm, err, tc.key, tc.time)
		}
	}
}

func FuzzDecodeEnvelope(f *testing.F) {
	f.Add("a.b", "k", "12", []byte("v"))
	f.Add("a.", "", "x", []byte{})
	f.Fuzz(func(t *testing.T, subject, key, tm string, data []byte) {
		h := nats.Header{}
		if key != "" {
			h[HeaderKey] = []string{key}
		}
		if tm != "" {
			h[HeaderTime] = []string{tm}
		}
		k, _, err := decodeEnvelope(subject, h, data, time.Unix(0, 0), 1<<20)
		if err == nil && len(k) == 0 {
			t.Fatal("accepted an empty key")
		}
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("untyped error %v", err)
		}
	})
}

func TestAckReplyMeta(t *testing.T) {
	for _, tc := range []struct {
		reply string
		seq   uint64
		ts    int64
		ok    bool
	}{
		{"$JS.ACK.IN.cons.1.42.7.1700000000123456789.0", 42, 1700000000123456789, true},
		{"$JS.ACK._.hash.IN.cons.1.42.7.1700000000123456789.5.rnd", 42, 1700000000123456789, true},
		{"$JS.ACK.dom.hash.IN.cons.1.43.7.1700000000123456789.5", 43, 1700000000123456789, true},
		{"$JS.ACK.IN.cons.1.x.7.17.0", 0, 0, false},
		{"$JS.ACK.IN.cons.1.42.7", 0, 0, false},
		{"_INBOX.abc", 0, 0, false},
		{"", 0, 0, false},
	} {
		seq, ts, ok := ackReplyMeta(tc.reply)
		if seq != tc.seq || ts != tc.ts || ok != tc.ok {
			t.Errorf("ackReplyMeta(%q) = %d, %d, %v; want %d, %d, %v", tc.reply, seq, ts, ok, tc.seq, tc.ts, tc.ok)
		}
	}
}

// TestDecodeTableEntry: a KV entry's key is its subject after the bucket's
// prefix (dots included); DEL and PURGE are deletes; anything else is
// malformed, a dead letter.
func TestDecodeTableEntry(t *testing.T) {
	ts := time.UnixMilli(1_700_000_000_123)
	key, tm, del, err := decodeTableEntry("USERS", "$KV.USERS.eu.u1", nil, []byte("alice"), ts, 1024)
	if err != nil || string(key) != "eu.u1" || tm != 1_700_000_000_123 || del {
		t.Fatalf("put: %q %d %v %v", key, tm, del, err)
	}
	for _, op := range []string{"DEL", "PURGE"} {
		if _, _, del, err := decodeTableEntry("USERS", "$KV.USERS.u1", nats.Header{"KV-Operation": {op}}, nil, ts, 1024); err != nil || !del {
			t.Errorf("%s: delete %v, %v", op, del, err)
		}
	}
	for _, bad := range []struct {
		subject string
		h       nats.Header
		data    string
	}{
		{"$KV.OTHER.u1", nil, "x"},
		{"$KV.USERS.", nil, "x"},
		{"$KV.USERS.u1", nats.Header{"KV-Operation": {"ROLLUP"}}, "x"},
		{"$KV.USERS.u1", nil, strings.Repeat("x", 1025)},
	} {
		if _, _, _, err := decodeTableEntry("USERS", bad.subject, bad.h, []byte(bad.data), ts, 1024); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s %v: %v, want ErrMalformed", bad.subject, bad.h, err)
		}
	}
}
