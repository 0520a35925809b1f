package statetool

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"cairn/checkpoint"
	"cairn/internal/base/procs"
	"cairn/state"
)

// The export format: JSON lines. The first line is a header (it has
// "cairn_state_export"); every other line is one entry:
//
//	{"stage":"count","kind":"value","kg":17,"key":"apple","sub":"","value":"MTI=","expires_ms":1700000000000}
//	{"stage":"count","kind":"timer","kg":17,"key":"apple","domain":"event","time":1700000000000}
//	{"stage":"_system","kind":"counter","kg":17,"counter":1,"value":"AAAAAAAAAAw="}
//
// key and sub are JSON strings when they are valid UTF-8, else key_b64 and
// sub_b64 (standard base64); value is always base64 (the operator's bytes,
// without the TTL header; a counter's stored bytes). expires_ms is present
// only on a value with an expiry. kg is the key group: informational for a
// stage's entries (import computes it from the key, and checks a kg it is
// given), required for "_system" entries, which the engine keeps per key
// group under keys of its own.

// ExportFormat is the version of the export format, in its header.
// INVARIANT: a change of a field's meaning bumps it; Import refuses other
// versions.
const ExportFormat = 1

// Header is the first line of an export.
type Header struct {
	Format        int               `json:"cairn_state_export"`
	Job           string            `json:"job"`
	From          string            `json:"from,omitempty"`
	ID            uint64            `json:"id,omitempty"`
	KeyGroups     int               `json:"key_groups"`
	Slots         int               `json:"slots,omitempty"`
	SourceStream  string            `json:"source_stream,omitempty"`
	SourceSeq     uint64            `json:"source_seq"`
	Modules       map[string]string `json:"modules,omitempty"`
	ABIVersion    int               `json:"abi_version,omitempty"`
	StateVersions map[string]int    `json:"state_versions,omitempty"`
	// Stages maps the stage names used in the lines to state ids.
	Stages map[string]uint8 `json:"stages,omitempty"`
}

// Stats counts what a tool read or wrote.
type Stats struct {
	Entries int64
	// Bytes is the stored size of the entries (keys and values as Pebble
	// holds them): the same measure for every tool.
	Bytes int64
	// Out is the bytes written (export: the JSON lines).
	Out int64
}

// ExportOptions configures Export.
type ExportOptions struct {
	Store checkpoint.Store
	// Manifest is the checkpoint or savepoint to export (recovery.Select).
	Manifest *checkpoint.Manifest
	// From names it in the header ("savepoint:NAME" or an id).
	From string
	// Stages names the state ids (DefaultStages when nil).
	Stages Stages
	// Stage, when set, exports only that stage's entries.
	Stage string
	// TempDir holds an incremental checkpoint's restored DB.
	TempDir string
	// Workers bounds the key groups read at once (default: the CPUs).
	Workers int
	// ValueJSON writes a value that is JSON as it is ("value_json") rather
	// than as base64 ("value"); import reads it back byte for byte.
	ValueJSON bool
}

// Export writes the state of o.Manifest to w as JSON lines, key group by
// key group in order (so two exports of the same state are identical).
func Export(ctx context.Context, w io.Writer, o ExportOptions) (Stats, error) {
	m := o.Manifest
	if o.Stages == nil {
		o.Stages = DefaultStages()
	}
	var only *uint8
	if o.Stage != "" {
		id, ok := o.Stages.id(o.Stage)
		if !ok {
			return Stats{}, fmt.Errorf("statetool: export stage %q: %w (stages: %s)", o.Stage, ErrUnknownStage, stageList(o.Stages))
		}
		only = &id
	}
	r, err := openReader(ctx, o.Store, m, o.TempDir)
	if err != nil {
		return Stats{}, fmt.Errorf("statetool: export: %w", err)
	}
	defer r.Close()
	bw := bufio.NewWriterSize(w, 1<<20)
	h := Header{Format: ExportFormat, Job: m.Job, From: o.From, ID: m.ID, KeyGroups: m.KeyGroups, Slots: len(m.Slots),
		SourceStream: m.SourceStream, SourceSeq: m.SourceSeq, Modules: m.Modules, ABIVersion: m.ABIVersion,
		StateVersions: m.StateVersions, Stages: o.Stages}
	hb, err := json.Marshal(h)
	if err != nil {
		return Stats{}, err
	}
	var st Stats
	bw.Write(hb)
	bw.WriteByte('\n')
	st.Out += int64(len(hb) + 1)
	type chunk struct {
		b       []byte
		n, size int64
	}
	workers := o.Workers
	if workers <= 0 {
		workers = procs.CPUs()
	}
	err = ordered(ctx, m.KeyGroups, workers, func(ctx context.Context, kg int) (chunk, error) {
		var c chunk
		err := r.keyGroup(ctx, kg, func(k, v []byte) error {
			e, err := decodeEntry(k, v)
			if err != nil {
				return err
			}
			if only != nil && e.Stage != *only {
				return nil
			}
			c.n++
			c.size += int64(len(k) + len(v))
			c.b = appendLine(c.b, &e, o.Stages, o.ValueJSON)
			return nil
		})
		return c, err
	}, func(kg int, c chunk) error {
		st.Entries += c.n
		st.Bytes += c.size
		st.Out += int64(len(c.b))
		_, err := bw.Write(c.b)
		return err
	})
	if err != nil {
		return st, fmt.Errorf("statetool: export %s/%d: %w", m.Job, m.ID, err)
	}
	if err := bw.Flush(); err != nil {
		return st, fmt.Errorf("statetool: export: %w", err)
	}
	return st, nil
}

// appendLine appends e as one JSON line. It writes the JSON itself (not
// encoding/json) because an export is one line per entry of the whole
// state: the reflection would cost more than reading the state.
func appendLine(b []byte, e *Entry, stages Stages, valueJSON bool) []byte {
	b = append(b, `{"stage":`...)
	b = appendJSONString(b, stages.name(e.Stage))
	b = append(b, `,"kind":"`...)
	b = append(b, e.Kind.String()...)
	b = append(b, `","kg":`...)
	b = strconv.AppendInt(b, int64(e.KeyGroup), 10)
	switch e.Kind {
	case state.KindValue:
		b = appendBytesField(b, "key", e.Key)
		if len(e.Sub) > 0 {
			b = appendBytesField(b, "sub", e.Sub)
		}
		if valueJSON && verbatimJSON(e.Value) {
			b = append(b, `,"value_json":`...)
			b = append(b, e.Value...)
		} else {
			b = append(b, `,"value":"`...)
			b = base64.StdEncoding.AppendEncode(b, e.Value)
			b = append(b, '"')
		}
		if e.HasExpiry {
			b = append(b, `,"expires_ms":`...)
			b = strconv.AppendInt(b, e.ExpiryMs, 10)
		}
	case state.KindTimer:
		b = appendBytesField(b, "key", e.Key)
		b = append(b, `,"domain":"`...)
		b = append(b, domainName(e.Domain)...)
		b = append(b, `","time":`...)
		b = strconv.AppendInt(b, e.Time, 10)
	case state.KindCounter:
		b = append(b, `,"counter":`...)
		b = strconv.AppendInt(b, int64(e.Counter), 10)
		b = append(b, `,"value":"`...)
		b = base64.StdEncoding.AppendEncode(b, e.Value)
		b = append(b, '"')
	}
	return append(b, "}\n"...)
}

// verbatimJSON reports whether v can stand in a line as it is and come
// back byte for byte: valid JSON, no line break (the line would end), no
// white space around it (a JSON decoder drops it).
func verbatimJSON(v []byte) bool {
	if len(v) == 0 || isSpace(v[0]) || isSpace(v[len(v)-1]) || bytes.ContainsAny(v, "\r\n") {
		return false
	}
	return json.Valid(v)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

func domainName(d uint8) string {
	if d == state.DomainProcessingTime {
		return "processing"
	}
	return "event"
}

// appendBytesField appends ,"name":"..." for UTF-8 bytes, else
// ,"name_b64":"...".
func appendBytesField(b []byte, name string, v []byte) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	if utf8.Valid(v) {
		b = append(b, '"', ':')
		return appendJSONString(b, string(v))
	}
	b = append(b, `_b64":"`...)
	b = base64.StdEncoding.AppendEncode(b, v)
	return append(b, '"')
}

// appendJSONString appends s, valid UTF-8, as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\t':
			b = append(b, '\\', 't')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

func stageList(s Stages) string {
	var names []string
	for n := range s {
		names = append(names, strconv.Quote(n))
	}
	if len(names) == 0 {
		return "none"
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
