package engine

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Header names of the message envelope (docs/DESIGN.md, "Message envelope").
const (
	HeaderKey   = "Cairn-Key"   // record key; input: else the subject's last token
	HeaderTime  = "Cairn-Time"  // event time, Unix milliseconds
	HeaderOut   = "Cairn-Out"   // per-key-group output index of an output
	HeaderError = "Cairn-Error" // dead letters: the reason
	HeaderStage = "Cairn-Stage" // dead letters: the stage (or "source")
	HeaderSeq   = "Cairn-Seq"   // dead letters: the input stream sequence
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderWatermark: on a repartition stream, the upstream's watermark
	// before the record or timer that made the message (Unix ms).
	HeaderWatermark = "Cairn-Wm"
	// HeaderMarker marks a watermark marker on a repartition stream: a
	// message that carries HeaderWatermark and HeaderOut but no record.
	HeaderMarker = "Cairn-Marker"
	// HeaderDelete marks a table's delete record on a repartition stream
	// (wasm.Record.Delete); the payload is empty.
	HeaderDelete = "Cairn-Delete"
	// HeaderSource, on the repartition stream a table input is forwarded
	// into, is the KV entry's stream sequence (on a marker: the last one
	// forwarded of its key group): a restarted forwarder skips by it.
	HeaderSource = "Cairn-Src"
)

// ErrMalformed is wrapped by every envelope decoding error.
var ErrMalformed = errors.New("engine: malformed message")

// KV header names and operations (the NATS KV protocol): an entry of a
// bucket is a message on $KV.<bucket>.<key>; a delete or purge carries
// KV-Operation.
const (
	kvOperation = "KV-Operation"
	kvDelete    = "DEL"
	kvPurge     = "PURGE"
)

// TableStream is the stream of NATS KV bucket b, and its subject filter.
func TableStream(bucket string) (stream, subjects string) {
	return "KV_" + bucket, "$KV." + bucket + ".>"
}

// decodeTableEntry extracts (key, time, delete) of an entry of KV bucket
// bucket: the key is the subject after "$KV.<bucket>.", the time its
// JetStream timestamp (a KV entry has no event time of its own), and a
// DEL or PURGE operation is a delete.
func decodeTableEntry(bucket, subject string, h nats.Header, data []byte, ts time.Time, maxBytes int) (key []byte, evTime int64, del bool, err error) {
	prefix := "$KV." + bucket + "."
	if !strings.HasPrefix(subject, prefix) || len(subject) == len(prefix) {
		return nil, 0, false, fmt.Errorf("%w: subject %q is not an entry of KV bucket %s ($KV.%s.<key>)", ErrMalformed, subject, bucket, bucket)
	}
	if len(data) > maxBytes {
		return nil, 0, false, fmt.Errorf("%w: payload of %d bytes exceeds max_message_bytes %d", ErrMalformed, len(data), maxBytes)
	}
	switch op := h.Get(kvOperation); op {
	case "":
	case kvDelete, kvPurge:
		del = true
	default:
		return nil, 0, false, fmt.Errorf("%w: header %s=%q (want %s or %s)", ErrMalformed, kvOperation, op, kvDelete, kvPurge)
	}
	return []byte(subject[len(prefix):]), ts.UnixMilli(), del, nil
}

// decodeEnvelope extracts (key, event time) of an input message. ts is the
// JetStream timestamp, the fallback event time.
func decodeEnvelope(subject string, h nats.Header, data []byte, ts time.Time, maxBytes int) (key []byte, evTime int64, err error) {
	if len(data) > maxBytes {
		return nil, 0, fmt.Errorf("%w: payload of %d bytes exceeds max_message_bytes %d", ErrMalformed, len(data), maxBytes)
	}
	evTime = ts.UnixMilli()
	if h != nil {
		if v, ok := h[HeaderKey]; ok {
			if len(v) != 1 || v[0] == "" {
				return nil, 0, fmt.Errorf("%w: header %s must have one non-empty value", ErrMalformed, HeaderKey)
			}
			key = []byte(v[0])
		}
		if v, ok := h[HeaderTime]; ok {
			if len(v) != 1 {
				return nil, 0, fmt.Errorf("%w: header %s must have one value", ErrMalformed, HeaderTime)
			}
			t, perr := strconv.ParseInt(strings.TrimSpace(v[0]), 10, 64)
			if perr != nil {
				return nil, 0, fmt.Errorf("%w: header %s=%q is not Unix milliseconds", ErrMalformed, HeaderTime, v[0])
			}
			evTime = t
		}
	}
	if key == nil {
		i := strings.LastIndexByte(subject, '.')
		tok := subject[i+1:]
		if tok == "" {
			return nil, 0, fmt.Errorf("%w: no %s header and subject %q has no last token", ErrMalformed, HeaderKey, subject)
		}
		key = []byte(tok)
	}
	return key, evTime, nil
}

// ackReplyMeta parses the stream sequence and the timestamp out of a
// JetStream delivery's reply subject without allocating (jetstream's
// Msg.Metadata builds a struct and every field). Layouts, as in nats.go:
//
//	v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//	v2: $JS.ACK.<domain>.<acc hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<token>...]
//
// ok is false for anything else; the caller then falls back to Metadata.
func ackReplyMeta(reply string) (seq uint64, ts int64, ok bool) {
	const prefix = "$JS.ACK."
	if !strings.HasPrefix(reply, prefix) {
		return 0, 0, false
	}
	var tok [12]string
	n := 0
	for rest := reply; n < len(tok); {
		t, r, more := strings.Cut(rest, ".")
		tok[n] = t
		n++
		if !more {
			break
		}
		rest = r
	}
	var sseq, tm string
	switch {
	case n == 9:
		sseq, tm = tok[5], tok[7]
	case n >= 11:
		sseq, tm = tok[7], tok[9]
	default:
		return 0, 0, false
	}
	seq, ok1 := parseDecimal(sseq)
	t, ok2 := parseDecimal(tm)
	if !ok1 || !ok2 || seq == 0 || t > math.MaxInt64 {
		return 0, 0, false
	}
	return seq, int64(t), true
}

func parseDecimal(s string) (uint64, bool) {
	if s == "" || len(s) > 19 {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}
