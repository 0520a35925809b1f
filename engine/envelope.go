package engine

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Header names of the message envelope (DESIGN.md "Message envelope").
const (
	HeaderKey   = "Cairn-Key"   // record key; input: else the subject's last token
	HeaderTime  = "Cairn-Time"  // event time, Unix milliseconds
	HeaderOut   = "Cairn-Out"   // per-key-group output index of an output
	HeaderError = "Cairn-Error" // dead letters: the reason
	HeaderStage = "Cairn-Stage" // dead letters: the stage (or "source")
	HeaderSeq   = "Cairn-Seq"   // dead letters: the input stream sequence
	HeaderMsgID = "Nats-Msg-Id"
)

// ErrMalformed is wrapped by every envelope decoding error.
var ErrMalformed = errors.New("engine: malformed message")

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
