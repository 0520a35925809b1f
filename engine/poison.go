package engine

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers a dead letter gets beside HeaderError, HeaderStage and HeaderSeq.
const (
	// HeaderTruncated: the dead letter's payload was cut to fit the server's
	// max_payload; the value is the original payload's size in bytes.
	HeaderTruncated = "Cairn-Truncated"
	// HeaderTruncatedHeaders names the copied headers whose values were cut
	// to dlValueMax bytes (comma-separated).
	HeaderTruncatedHeaders = "Cairn-Truncated-Headers"
	// HeaderHeadersDropped: the record's headers did not fit in a dead
	// letter at all; the value is how many were left out.
	HeaderHeadersDropped = "Cairn-Headers-Dropped"
	// HeaderOrigPrefix is put in front of a record's Nats-* headers on its
	// dead letter: a producer's publish conditions (Nats-Expected-Stream,
	// Nats-Expected-Last-Subject-Sequence, ...) and Nats-Msg-Id must not
	// apply to the dead-letter publish, which the server would refuse or
	// drop as a duplicate.
	HeaderOrigPrefix = "Cairn-Orig-"
)

// Bounds of a dead letter's headers. The server refuses a header block over
// 64 KiB; a dead letter stays far below.
const (
	dlValueMax  = 1024     // a copied header value is cut to this many bytes
	dlErrorMax  = 2048     // the reason is cut to this many bytes
	dlHeaderMax = 16 << 10 // copied headers beyond this are dropped
	// dlSlack covers the status line, HeaderTruncated, the Nats-Msg-Id
	// (deadLetterID, ~70 bytes) and rounding.
	dlSlack = 256
)

// outputHeaderBound bounds the headers of an output besides its key (and
// the job name in a dedupe Nats-Msg-Id): Cairn-Key, Cairn-Time, Cairn-Out,
// Nats-Msg-Id and the fence header, with 20-digit numbers.
const outputHeaderBound = 256

// fenceErrCode is the server's answer to a publish whose
// Nats-Expected-Last-Subject-Sequence does not hold (JSStreamWrongLastSequenceErrF):
// another writer appended to the key group. It is never the record's fault.
const fenceErrCode = 10071

// messageFault reports whether a publish failed because of the one message
// (its size, its headers: anything the server answers 400 to for that
// message) rather than the stream or the server. Such a message becomes a
// dead letter; any other publish failure stops the job.
func messageFault(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var ae *jetstream.APIError
	if errors.As(err, &ae) {
		return ae.Code == 400 && ae.ErrorCode != fenceErrCode
	}
	return false
}

// headerBytes is the size of h in the wire format (NATS/1.0 status line,
// "Name: value\r\n" per value, the closing CRLF).
func headerBytes(h nats.Header) int {
	n := len("NATS/1.0\r\n") + 2
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + 2 + len(v) + 2
		}
	}
	return n
}

// checkOutput reports why an output cannot be published (nil: it fits): a
// key over maxKey, or headers and value over the server's max_payload.
func checkOutput(key, value []byte, maxKey int, maxPayload int64, job string) error {
	if len(key) > maxKey {
		return fmt.Errorf("engine: output key of %d bytes exceeds max_key_bytes %d", len(key), maxKey)
	}
	if maxPayload <= 0 {
		return nil
	}
	if n := int64(len(value) + len(key) + len(job) + outputHeaderBound); n > maxPayload {
		return fmt.Errorf("engine: output of %d bytes (value %d, key %d, headers) exceeds the server's max_payload %d", n, len(value), len(key), maxPayload)
	}
	return nil
}

// deadLetterMessage builds the dead letter of a record: its headers (Nats-*
// ones renamed with HeaderOrigPrefix, long values cut), the reason, stage
// and input sequence, and its payload, cut so the whole message fits
// maxPayload (0: no bound). The result never depends on anything but its
// arguments, so a replay builds the same dead letter.
func deadLetterMessage(subject string, h nats.Header, data []byte, stage string, seq uint64, reason error, maxPayload int64) *nats.Msg {
	nh := make(nats.Header, len(h)+4)
	var cut []string
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		name := k
		switch {
		case isOwnDeadLetterHeader(k):
			name = HeaderOrigPrefix + k // a dead letter of a dead letter
		case len(k) >= 5 && strings.EqualFold(k[:5], "nats-"):
			name = HeaderOrigPrefix + k
		}
		for _, v := range h[k] {
			if len(v) > dlValueMax {
				v = v[:dlValueMax]
				if !slices.Contains(cut, name) {
					cut = append(cut, name)
				}
			}
			nh[name] = append(nh[name], v)
		}
	}
	if headerBytes(nh) > dlHeaderMax {
		nh = nats.Header{HeaderHeadersDropped: {strconv.Itoa(len(keys))}}
		cut = nil
	}
	if len(cut) > 0 {
		nh[HeaderTruncatedHeaders] = []string{truncate(strings.Join(cut, ","), dlValueMax)}
	}
	msg := "unknown"
	if reason != nil {
		msg = reason.Error()
	}
	nh[HeaderError] = []string{truncate(msg, dlErrorMax)}
	nh[HeaderStage] = []string{truncate(stage, dlValueMax)}
	nh[HeaderSeq] = []string{strconv.FormatUint(seq, 10)}
	if maxPayload > 0 {
		budget := maxPayload - int64(headerBytes(nh)) - dlSlack
		if int64(len(data)) > budget {
			nh[HeaderTruncated] = []string{strconv.Itoa(len(data))}
			data = data[:max(budget, 0)]
		}
	}
	return &nats.Msg{Subject: subject, Header: nh, Data: data}
}

func isOwnDeadLetterHeader(k string) bool {
	switch k {
	case HeaderError, HeaderStage, HeaderSeq, HeaderTruncated, HeaderTruncatedHeaders, HeaderHeadersDropped:
		return true
	}
	return false
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && s[len(s)-1]&0xC0 == 0x80 {
		s = s[:len(s)-1]
	}
	if len(s) > 0 && s[len(s)-1] >= 0xC0 {
		s = s[:len(s)-1]
	}
	return s
}
