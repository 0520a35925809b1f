package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/demo"
	"cairn/internal/testutil/testbin"
)

// The two job shapes of the poison test. words is the wordcount (the key is
// a word split out of the line); values passes each key's first value
// through unchanged (builtin:dedupe), so a key from the Cairn-Key header
// and a value near max_payload both reach the router and the sink. Both
// allow messages up to the server's max_payload (max_message_bytes above
// it), so the server's limit is the one that bounds them.
const poisonWordsJob = `
name: words
input:  {stream: LINES, subjects: ["lines.>"]}
stages:
  - {name: split, module: "builtin:split"}
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: COUNTS, subject: counts, delivery: exactly_once}
key_groups: 64
slots: 2
batch_size: 256
max_message_bytes: 16777216
watermark: {max_out_of_orderness: 1s}
checkpoint: {interval: 200ms, mode: incremental, retain: 3}
`

const poisonValuesJob = `
name: values
input:  {stream: EVENTS, subjects: ["events.>"]}
stages:
  - {name: first, module: "builtin:dedupe", keyed: true}
output: {stream: VALUES, subject: values, delivery: exactly_once}
key_groups: 16
slots: 2
batch_size: 64
max_message_bytes: 16777216
watermark: {max_out_of_orderness: 1s}
checkpoint: {interval: 200ms, mode: incremental, retain: 3}
`

// maxKeyBytes is the engine's default max_key_bytes (the jobs leave it out).
const maxKeyBytes = engine.DefaultMaxKeyBytes

// poisonRec is one published input message and what it must become.
type poisonRec struct {
	msg   *nats.Msg
	seq   uint64
	phase int
	what  string // the case, for the figures and failures

	words []string // words: the words it adds to the counts

	hasOut bool   // values: its expected output (key, value)
	outKey string // also the key of a values record
	outVal []byte

	stage     string // the dead letter's expected Cairn-Stage ("": none)
	dlKey     string // router and sink dead letters: the record's key and value
	dlVal     []byte
	dlTime    string // when set, the dead letter's Cairn-Time
	truncated bool   // the dead letter must carry Cairn-Truncated

	// Condition headers filled in at publish time with the right values,
	// so that the producer's publish succeeds.
	lastSubjSeq, lastSeq bool
}

// poisonJob is one job of the test: its cairn process, its input and its
// expectations, in input sequence order.
type poisonJob struct {
	t        *testing.T
	h        *harness
	name     string
	stream   string
	js       jetstream.JetStream
	recs     []*poisonRec
	subjLast map[string]uint64
	cmd      *exec.Cmd
	done     chan error
}

func newPoisonJob(t *testing.T, bin, url string, js jetstream.JetStream, name, stream, yaml string) *poisonJob {
	t.Helper()
	dir := t.TempDir()
	h := &harness{t: t, bin: bin, natsURL: url, js: js, store: "file://" + filepath.Join(dir, "store") + "?create_dir=true",
		data: filepath.Join(dir, "data"), jobFile: filepath.Join(dir, "job.yaml"), httpAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	if err := os.WriteFile(h.jobFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return &poisonJob{t: t, h: h, name: name, stream: stream, js: js, subjLast: map[string]uint64{}}
}

// publish publishes one record synchronously (the condition headers need
// the stream's exact state) and checks that the producer's publish was
// accepted at the expected sequence.
func (p *poisonJob) publish(r *poisonRec) error {
	if r.lastSubjSeq {
		if n := p.subjLast[r.msg.Subject]; n > 0 {
			r.msg.Header["Nats-Expected-Last-Subject-Sequence"] = []string{strconv.FormatUint(n, 10)}
		}
	}
	if r.lastSeq && len(p.recs) > 0 {
		r.msg.Header["Nats-Expected-Last-Sequence"] = []string{strconv.Itoa(len(p.recs))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ack, err := p.js.PublishMsg(ctx, r.msg)
	if err != nil {
		return fmt.Errorf("%s: producer publish of %s (%d bytes) refused: %w", p.name, r.what, len(r.msg.Data), err)
	}
	if want := uint64(len(p.recs) + 1); ack.Sequence != want {
		return fmt.Errorf("%s: %s stored at seq %d, want %d", p.name, r.what, ack.Sequence, want)
	}
	r.seq = ack.Sequence
	p.recs = append(p.recs, r)
	p.subjLast[r.msg.Subject] = r.seq
	return nil
}

func (p *poisonJob) last() uint64 { return uint64(len(p.recs)) }

func (p *poisonJob) start() {
	p.cmd, p.done = p.h.start()
	cmd := p.cmd
	// A test that fails half-way leaves no cairn behind (an exited one
	// makes Kill a no-op error).
	p.t.Cleanup(func() { _ = cmd.Process.Kill() })
}

// alive fails the test if the job exited on its own.
func (p *poisonJob) alive() {
	p.t.Helper()
	select {
	case err := <-p.done:
		p.t.Fatalf("%s: cairn exited on its own: %v\n%s", p.name, err, tail(p.h.logs.String(), 6000))
	default:
	}
}

// waitProcessed waits until the job has processed its whole input.
func (p *poisonJob) waitProcessed() engine.Stats {
	p.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		p.alive()
		if st, ok := p.h.stats(); ok && st.ProcessedSeq >= p.last() {
			return st
		}
		if time.Now().After(deadline) {
			st, _ := p.h.stats()
			p.t.Fatalf("%s: processed seq %d, want %d\n%s", p.name, st.ProcessedSeq, p.last(), tail(p.h.logs.String(), 6000))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killWhenAhead SIGKILLs the job once it has processed past minSeq and past
// its last checkpoint (so the restart replays processed records), or at
// the deadline. It returns the processed sequence seen just before.
func (p *poisonJob) killWhenAhead(minSeq uint64, deadline time.Time) (processed uint64, replayForced bool) {
	for {
		if st, ok := p.h.stats(); ok {
			processed = st.ProcessedSeq
			if st.ProcessedSeq >= minSeq && st.ProcessedSeq > st.LastChkSeq {
				replayForced = true
				break
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(3 * time.Millisecond)
	}
	select {
	case err := <-p.done:
		p.t.Errorf("%s: cairn exited before the kill: %v\n%s", p.name, err, tail(p.h.logs.String(), 6000))
		return processed, false
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return processed, replayForced
}

// stop stops the job with SIGTERM, which must exit 0.
func (p *poisonJob) stop() {
	p.t.Helper()
	p.alive()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			p.t.Fatalf("%s: cairn exited with %v after SIGTERM\n%s", p.name, err, tail(p.h.logs.String(), 6000))
		}
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		p.t.Fatalf("%s: cairn did not stop after SIGTERM", p.name)
	}
}

var startSeqRE = regexp.MustCompile(`job running.*start_seq[=":\s]+(\d+)`)

// startSeq is the start sequence the last "job running" line reports.
func (p *poisonJob) startSeq() uint64 {
	m := startSeqRE.FindAllStringSubmatch(p.h.logs.String(), -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.ParseUint(m[len(m)-1][1], 10, 64)
	return n
}

// poisonGen makes the input: good records, the fixed poison cases and a
// seeded fuzz of header blocks and sizes.
type poisonGen struct {
	rng        *rand.Rand
	corpus     *demo.Corpus
	maxPayload int
	seed       uint64
	id         int // unique message ids and keys
}

func (g *poisonGen) letters(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + g.rng.IntN(26))
	}
	return string(b)
}

// filler is n payload bytes, cheap for megabytes.
func (g *poisonGen) filler(n int) []byte {
	chunk := []byte(g.letters(997))
	return bytes.Repeat(chunk, n/len(chunk)+1)[:n]
}

// headerValue is a printable header value without spaces (the client trims
// leading blanks when it reads a header).
func (g *poisonGen) headerValue(n int) string {
	const cs = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&()*+,-./:;<=>?@[]^_{|}~"
	b := make([]byte, n)
	for i := range b {
		b[i] = cs[g.rng.IntN(len(cs))]
	}
	return string(b)
}

func (g *poisonGen) fuzzSize() int {
	switch f := g.rng.Float64(); {
	case f < 0.6:
		return g.rng.IntN(64)
	case f < 0.9:
		return g.rng.IntN(2048)
	default:
		return 2048 + g.rng.IntN(22000)
	}
}

// headerWire is the size of a header block on the wire (0: none).
func headerWire(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + 2
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + 2 + len(v) + 2
		}
	}
	return n
}

// headerBudget keeps every input header block well under the server's
// 64 KiB header limit (with room for the condition headers filled in at
// publish time).
const headerBudget = 60000

// fuzzHeaders adds a random block of X-Fuzz headers and producer Nats-*
// headers (each one the server accepts) to h.
func (g *poisonGen) fuzzHeaders(r *poisonRec, stream string) {
	h := r.msg.Header
	for range g.rng.IntN(7) {
		name := "X-Fuzz-" + g.letters(1+g.rng.IntN(12))
		v := g.headerValue(g.fuzzSize())
		if headerWire(h)+len(name)+len(v)+4 > headerBudget-200 {
			break
		}
		h[name] = append(h[name], v) // a name may repeat
	}
	if g.rng.IntN(3) == 0 {
		h["Nats-Expected-Stream"] = []string{stream}
	}
	if g.rng.IntN(3) == 0 {
		g.id++
		h["Nats-Msg-Id"] = []string{fmt.Sprintf("poison-%d-%d", g.seed, g.id)}
	}
	r.lastSubjSeq = g.rng.IntN(5) == 0
	r.lastSeq = g.rng.IntN(10) == 0
}

func (g *poisonGen) badTime() string { return "t" + g.headerValue(g.rng.IntN(40)) }

func (g *poisonGen) futureTime() string {
	switch g.rng.IntN(3) {
	case 0:
		return "9223372036854775807"
	case 1:
		return strconv.FormatInt(time.Now().Add(10*time.Minute+time.Duration(g.rng.IntN(3600))*time.Second).UnixMilli(), 10)
	default:
		return strconv.FormatInt(time.Now().AddDate(1, 0, 0).UnixMilli(), 10)
	}
}

func (g *poisonGen) lateTime() string {
	return []string{"1", "0", "-5", strconv.FormatInt(time.Now().AddDate(0, 0, -1).UnixMilli(), 10)}[g.rng.IntN(4)]
}

// Job words: lines on lines.*.

func (g *poisonGen) line(subject, what string) *poisonRec {
	l, _ := g.corpus.Line()
	return &poisonRec{msg: &nats.Msg{Subject: subject, Header: nats.Header{}, Data: []byte(l)}, what: what, words: splitWords(l)}
}

// oneWord is a line of one word whose event time makes it a dead letter at
// the router: one dead letter, nothing counted.
func (g *poisonGen) oneWord(subject, what, t string) *poisonRec {
	w := g.letters(3 + g.rng.IntN(8))
	return &poisonRec{msg: &nats.Msg{Subject: subject, Header: nats.Header{engine.HeaderTime: {t}}, Data: []byte(w)}, what: what,
		stage: "router", dlKey: w, dlVal: []byte("1"), dlTime: t}
}

// longWord is a line holding one word of n bytes between two counted
// words: the word is a key over max_key_bytes (a dead letter at the
// router), the others are counted.
func (g *poisonGen) longWord(subject, what string, n int) *poisonRec {
	w := g.letters(n)
	r := &poisonRec{msg: &nats.Msg{Subject: subject, Header: nats.Header{}, Data: []byte("alpha " + w + " omega")}, what: what, words: []string{"alpha", "omega"}}
	if n > maxKeyBytes {
		r.stage, r.dlKey, r.dlVal = "router", w, []byte("1")
	} else {
		r.words = append(r.words, w)
	}
	return r
}

// nearMax is a message on subject with headers h whose payload leaves
// slack bytes under the server's max_payload.
func (g *poisonGen) nearMax(subject string, h nats.Header, slack int) *nats.Msg {
	n := g.maxPayload - headerWire(h) - slack
	return &nats.Msg{Subject: subject, Header: h, Data: g.filler(n)}
}

// wordsFixed are the named poison cases of one phase of job words.
func (g *poisonGen) wordsFixed(phase int) []*poisonRec {
	var rs []*poisonRec
	// (1) A line holding one 70,000-byte word: a key over max_key_bytes.
	rs = append(rs, g.longWord("lines.in", "word-70000", 70000))
	if phase == 1 {
		// The limit itself: a 16 KiB word is a key (and an output header),
		// one byte more is a dead letter.
		rs = append(rs, g.longWord("lines.in", "word-at-max_key_bytes", maxKeyBytes))
		rs = append(rs, g.longWord("lines.in", "word-max_key_bytes+1", maxKeyBytes+1))
		// A Cairn-Key header over the limit on a line: split re-keys by
		// word, so the record is good.
		r := g.line("lines.in", "line-with-Cairn-Key-30000")
		r.msg.Header[engine.HeaderKey] = []string{g.letters(30000)}
		rs = append(rs, r)
		// (2) A bad Cairn-Time with the producer's condition headers; the
		// input publish holds (lines.cond's only message is seq 1).
		r = g.line("lines.cond", "bad-time+Nats-Expected-Last-Subject-Sequence:1")
		r.words, r.stage = nil, "source"
		r.msg.Header[engine.HeaderTime] = []string{"yesterday"}
		r.msg.Header["Nats-Expected-Last-Subject-Sequence"] = []string{"1"}
		rs = append(rs, r)
	}
	r := g.line("lines.in", "bad-time+Nats-Expected-Stream")
	r.words, r.stage = nil, "source"
	r.msg.Header[engine.HeaderTime] = []string{g.badTime()}
	r.msg.Header["Nats-Expected-Stream"] = []string{"LINES"}
	g.id++
	r.msg.Header["Nats-Msg-Id"] = []string{fmt.Sprintf("poison-%d-%d", g.seed, g.id)}
	rs = append(rs, r)
	// (3) A payload just under max_payload with a bad header: its dead
	// letter would not fit without truncation.
	m := g.nearMax("lines.in", nats.Header{engine.HeaderTime: {"not-a-time"}, "Nats-Expected-Stream": {"LINES"}}, 16)
	rs = append(rs, &poisonRec{msg: m, what: "near-max_payload+bad-time", stage: "source", truncated: true})
	// (4) The far future.
	rs = append(rs, g.oneWord("lines.in", "time-MaxInt64", "9223372036854775807"))
	return rs
}

// wordsFuzz is one random record of job words.
func (g *poisonGen) wordsFuzz() *poisonRec {
	subject := "lines." + []string{"a", "b", "c"}[g.rng.IntN(3)]
	var r *poisonRec
	switch k := g.rng.IntN(100); {
	case k < 45:
		r = g.line(subject, "fuzz-good")
	case k < 55:
		r = g.line(subject, "fuzz-bad-time")
		r.words, r.stage = nil, "source"
		r.msg.Header[engine.HeaderTime] = []string{g.badTime()}
	case k < 59:
		r = g.line(subject, "fuzz-two-times")
		r.words, r.stage = nil, "source"
		now := strconv.FormatInt(time.Now().UnixMilli(), 10)
		r.msg.Header[engine.HeaderTime] = []string{now, now}
	case k < 65:
		r = g.line(subject, "fuzz-bad-key")
		r.words, r.stage = nil, "source"
		if g.rng.IntN(2) == 0 {
			r.msg.Header[engine.HeaderKey] = []string{""}
		} else {
			r.msg.Header[engine.HeaderKey] = []string{"a", "b"}
		}
	case k < 73:
		r = g.oneWord(subject, "fuzz-future-time", g.futureTime())
	case k < 80:
		r = g.oneWord(subject, "fuzz-late-time", g.lateTime())
	case k < 92:
		r = g.longWord(subject, "fuzz-long-word", maxKeyBytes+1+g.rng.IntN(120000))
	case k < 96:
		r = g.line(subject, "fuzz-near-max+bad-time")
		r.words, r.stage = nil, "source"
		r.msg.Header[engine.HeaderTime] = []string{g.badTime()}
	default:
		// One word filling the message: a key far over the limit.
		r = &poisonRec{msg: &nats.Msg{Subject: subject, Header: nats.Header{}}, what: "fuzz-giant-word", stage: "router", dlVal: []byte("1")}
	}
	if r.stage != "source" && r.msg.Header[engine.HeaderKey] == nil && g.rng.IntN(5) == 0 {
		// A valid Cairn-Key of any length up to the header limit: split
		// re-keys by word, so it changes nothing.
		r.msg.Header[engine.HeaderKey] = []string{g.letters(1 + g.rng.IntN(40000))}
	}
	g.fuzzHeaders(r, "LINES")
	switch r.what {
	case "fuzz-near-max+bad-time":
		r.msg.Data = g.filler(g.maxPayload - headerWire(r.msg.Header) - 100 - g.rng.IntN(200))
	case "fuzz-giant-word":
		n := min(g.maxPayload, 1<<20) - headerWire(r.msg.Header) - 100 - g.rng.IntN(4096)
		w := g.letters(n)
		r.msg.Data, r.dlKey = []byte(w), w
	}
	return r
}

// Job values: events on events.x, key in Cairn-Key.

func (g *poisonGen) event(what string, keyLen, valLen int) *poisonRec {
	g.id++
	key := fmt.Sprintf("e%d-", g.id)
	key += g.letters(max(keyLen-len(key), 0))
	val := g.filler(valLen)
	return &poisonRec{msg: &nats.Msg{Subject: "events.x", Header: nats.Header{engine.HeaderKey: {key}}, Data: val}, what: what,
		hasOut: true, outKey: key, outVal: val}
}

// routerDL turns r into a record its router dead-letters.
func (r *poisonRec) routerDL() *poisonRec {
	r.hasOut, r.stage, r.dlKey, r.dlVal = false, "router", r.outKey, r.outVal
	return r
}

func (g *poisonGen) valuesFixed(phase int) []*poisonRec {
	var rs []*poisonRec
	if phase == 1 {
		rs = append(rs, g.event("key-at-max_key_bytes", maxKeyBytes, 10))
		rs = append(rs, g.event("key-max_key_bytes+1", maxKeyBytes+1, 10).routerDL())
		// A value near max_payload that still fits an output.
		rs = append(rs, g.event("value-near-max-fits", 12, g.maxPayload-4096))
	}
	// (1) A Cairn-Key header over the limit.
	rs = append(rs, g.event("Cairn-Key-40000", 40000, 100).routerDL())
	// (3) A good message near max_payload: its output (value + key + the
	// cairn headers) cannot fit, so the sink dead-letters it.
	r := g.event("output-over-max_payload", 12, 0)
	r.msg.Data = g.nearMax("events.x", r.msg.Header, 16).Data
	r.hasOut, r.stage, r.dlKey, r.dlVal, r.truncated = false, "first", r.outKey, r.msg.Data, true
	rs = append(rs, r)
	// (3) The same size with a bad header: a source dead letter, cut.
	r = g.event("near-max_payload+bad-time", 12, 0)
	r.msg.Header[engine.HeaderTime] = []string{"soon"}
	r.msg.Header["Nats-Expected-Stream"] = []string{"EVENTS"}
	r.msg.Data = g.nearMax("events.x", r.msg.Header, 16).Data
	r.hasOut, r.stage, r.truncated = false, "source", true
	rs = append(rs, r)
	// (4) The far future.
	r = g.event("time-MaxInt64", 12, 20).routerDL()
	r.msg.Header[engine.HeaderTime] = []string{"9223372036854775807"}
	r.dlTime = "9223372036854775807"
	rs = append(rs, r)
	return rs
}

func (g *poisonGen) valuesFuzz() *poisonRec {
	var r *poisonRec
	switch k := g.rng.IntN(100); {
	case k < 50:
		r = g.event("fuzz-good", 4+g.rng.IntN(60), g.fuzzSize())
	case k < 55:
		// Near max_payload, clearly fitting an output (sized below).
		r = g.event("fuzz-good-big", 12, 0)
	case k < 65:
		r = g.event("fuzz-long-key", maxKeyBytes+1+g.rng.IntN(40000), g.fuzzSize()).routerDL()
	case k < 73:
		r = g.event("fuzz-bad-time", 12, g.fuzzSize())
		r.msg.Header[engine.HeaderTime] = []string{g.badTime()}
		r.hasOut, r.stage = false, "source"
	case k < 78:
		r = g.event("fuzz-bad-key", 12, g.fuzzSize())
		r.msg.Header[engine.HeaderKey] = append(r.msg.Header[engine.HeaderKey], "second")
		r.hasOut, r.stage = false, "source"
	case k < 86:
		t := g.futureTime()
		r = g.event("fuzz-future-time", 12, g.fuzzSize()).routerDL()
		r.msg.Header[engine.HeaderTime], r.dlTime = []string{t}, t
	case k < 92:
		t := g.lateTime()
		r = g.event("fuzz-late-time", 12, g.fuzzSize()).routerDL()
		r.msg.Header[engine.HeaderTime], r.dlTime = []string{t}, t
	case k < 96:
		r = g.event("fuzz-output-over-max", 12, 0)
		r.hasOut, r.stage, r.truncated = false, "first", true
	default:
		r = g.event("fuzz-near-max+bad-time", 12, 0)
		r.msg.Header[engine.HeaderTime] = []string{g.badTime()}
		r.hasOut, r.stage = false, "source"
	}
	if r.what != "fuzz-output-over-max" {
		g.fuzzHeaders(r, "EVENTS")
	}
	switch r.what {
	case "fuzz-good-big":
		r.msg.Data = g.filler(g.maxPayload - headerWire(r.msg.Header) - 100 - 8192 - g.rng.IntN(8192))
	case "fuzz-output-over-max":
		// Less than the output's own headers (Cairn-Key, Cairn-Time,
		// Cairn-Out: at least 41 bytes more than this record's Cairn-Key)
		// under max_payload: the output cannot fit.
		r.msg.Data = g.filler(g.maxPayload - headerWire(r.msg.Header) - 16 - g.rng.IntN(24))
		r.dlKey, r.dlVal = r.outKey, r.msg.Data
	case "fuzz-near-max+bad-time":
		r.msg.Data = g.filler(g.maxPayload - headerWire(r.msg.Header) - 100 - g.rng.IntN(200))
	}
	if r.hasOut {
		r.outVal = r.msg.Data
	}
	return r
}

// phaseInput is the input of one phase for both jobs: fixed cases spread
// between good records, fuzz records among them.
func (g *poisonGen) phaseInput(phase, goodLines, fuzzWords, goodEvents, fuzzValues int) (words, values []*poisonRec) {
	for i := range goodLines {
		words = append(words, g.line("lines.in", "good"))
		if i%7 == 0 {
			words[len(words)-1].msg.Header = nil // no header block at all
		}
	}
	for range fuzzWords {
		words = append(words, g.wordsFuzz())
	}
	g.rng.Shuffle(len(words), func(i, j int) { words[i], words[j] = words[j], words[i] })
	for i, r := range g.wordsFixed(phase) {
		at := (i + 1) * len(words) / 12 // between good records, never last
		words = slices.Insert(words, at, r)
	}
	for range goodEvents {
		values = append(values, g.event("good", 4+g.rng.IntN(30), g.rng.IntN(300)))
	}
	for range fuzzValues {
		values = append(values, g.valuesFuzz())
	}
	g.rng.Shuffle(len(values), func(i, j int) { values[i], values[j] = values[j], values[i] })
	for i, r := range g.valuesFixed(phase) {
		values = slices.Insert(values, (i+1)*len(values)/10, r)
	}
	return words, values
}

// TestPoisonMessages publishes every kind of poison record (each once able
// to stop a job or spoil its outputs) between good
// records to two jobs (a wordcount and a value pass-through) run as cairn
// processes, against the embedded server (max_payload 8 MiB) and an
// external nats-server with its default 1 MiB: the jobs never exit, each
// bad record is exactly one dead letter with a reason that fits the
// server's limits, every good record's output is exact, and a SIGKILL in
// the middle plus a restart changes none of it. Seeded: rerun a failure
// with CAIRN_POISON_SEED.
func TestPoisonMessages(t *testing.T) {
	// Mostly waiting on processes and servers: run beside another.
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CAIRN_POISON_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("CAIRN_POISON_SEED: %v", err)
		}
	}
	t.Logf("seed %d (rerun: CAIRN_POISON_SEED=%d go test ./e2e -run TestPoisonMessages -count=1)", seed, seed)
	for i, server := range []string{"embedded", "external"} {
		t.Run(server, func(t *testing.T) {
			poisonCase(t, server, seed+uint64(i))
		})
	}
}

func poisonCase(t *testing.T, server string, seed uint64) {
	t0 := time.Now()
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	var url string
	if server == "embedded" {
		url = startNATS(t)
	} else {
		url = startExternalNATS(t)
	}
	nc, js := connectJS(t, url)
	maxPayload := int(nc.MaxPayload())
	createStream(t, js, "LINES", "lines.>")
	createStream(t, js, "EVENTS", "events.>")
	g := &poisonGen{rng: rand.New(rand.NewPCG(seed, 9)), corpus: demo.NewCorpus(seed, 300), maxPayload: maxPayload, seed: seed}
	words := newPoisonJob(t, bin, url, js, "words", "LINES", poisonWordsJob)
	values := newPoisonJob(t, bin, url, js, "values", "EVENTS", poisonValuesJob)
	defer func() {
		if t.Failed() {
			for _, p := range []*poisonJob{words, values} {
				t.Logf("%s logs:\n%s", p.name, tail(p.h.logs.String(), 4000))
			}
		}
	}()

	publish := func(p *poisonJob, rs []*poisonRec, phase int) {
		t.Helper()
		for _, r := range rs {
			r.phase = phase
			if err := p.publish(r); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Phase 1: lines.cond's first message is seq 1, so the condition
	// header Nats-Expected-Last-Subject-Sequence: 1 holds later.
	first := g.line("lines.cond", "good")
	first.phase = 1
	if err := words.publish(first); err != nil {
		t.Fatal(err)
	}
	// The first event is good too: a late event needs a watermark.
	firstEvent := g.event("good", 8, 8)
	firstEvent.phase = 1
	if err := values.publish(firstEvent); err != nil {
		t.Fatal(err)
	}
	w1, v1 := g.phaseInput(1, 500, 40, 120, 30)
	publish(words, w1, 1)
	publish(values, v1, 1)
	words.start()
	values.start()
	for _, p := range []*poisonJob{words, values} {
		st := p.waitProcessed()
		checkWatermark(t, p, st)
		// No restart yet: every bad record is exactly one dead letter.
		checkDeadLetters(t, p, maxPayload, func(*poisonRec) bool { return true })
	}

	// Phase 2: input arrives while both jobs run; each is SIGKILLed once
	// it has processed records its last checkpoint does not cover, the
	// rest of the input arrives while it is down, and it restarts.
	w2, v2 := g.phaseInput(2, 600, 50, 150, 30)
	w1End, v1End := words.last(), values.last()
	var pubErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < len(w2) || i < len(v2); i++ {
			for _, x := range []struct {
				p  *poisonJob
				rs []*poisonRec
			}{{words, w2}, {values, v2}} {
				if i < len(x.rs) {
					x.rs[i].phase = 2
					if err := x.p.publish(x.rs[i]); err != nil {
						pubErr = err
						return
					}
				}
			}
			if i%20 == 19 {
				time.Sleep(10 * time.Millisecond) // spread phase 2 over a second or two
			}
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	wKill, wForced := words.killWhenAhead(w1End+uint64(len(w2)/4), deadline)
	vKill, vForced := values.killWhenAhead(v1End+uint64(len(v2)/4), deadline)
	wg.Wait()
	if pubErr != nil {
		t.Fatal(pubErr)
	}
	for _, p := range []*poisonJob{words, values} {
		mark := len(p.h.logs.String())
		p.start()
		p.waitProcessed()
		if !strings.Contains(p.h.logs.String()[mark:], "job running") {
			t.Fatalf("%s: processed after the restart without a 'job running' line", p.name)
		}
	}
	wReplay := int64(wKill) - int64(words.startSeq()-1)
	vReplay := int64(vKill) - int64(values.startSeq()-1)
	t.Logf("SIGKILL: words at processed seq %d (ahead of its checkpoint: %v), restarted at seq %d: %d records replayed; values at %d (%v), restarted at %d: %d replayed",
		wKill, wForced, words.startSeq(), wReplay, vKill, vForced, values.startSeq(), vReplay)

	// Phase 3: after the restart, the same cases again; then a graceful stop.
	w3, v3 := g.phaseInput(3, 300, 40, 80, 20)
	publish(words, w3, 3)
	publish(values, v3, 3)
	for _, p := range []*poisonJob{words, values} {
		st := p.waitProcessed()
		checkWatermark(t, p, st)
		p.stop()
	}

	// Outputs: exact, and one per (key group, Cairn-Out).
	model := map[string]int{}
	for _, r := range words.recs {
		for _, w := range r.words {
			model[w]++
		}
	}
	checkOutputs(t, js, "COUNTS", "counts", 64, model)
	checkState(t, words.h.data, 64, 2, model)
	wantVals := map[string][]byte{}
	for _, r := range values.recs {
		if r.hasOut {
			wantVals[r.outKey] = r.outVal
		}
	}
	out := readBigStream(t, js, "VALUES", len(wantVals))
	if len(out) != len(wantVals) {
		byKey := map[string]*poisonRec{}
		for _, r := range values.recs {
			byKey[r.outKey] = r
		}
		for _, m := range out {
			k := m.Headers().Get(engine.HeaderKey)
			if _, ok := wantVals[k]; !ok {
				r := byKey[k]
				if r == nil {
					t.Errorf("values: output of unknown key %.40q", k)
				} else {
					t.Errorf("values: output of seq %d (%s, phase %d, headers %v), which is bad", r.seq, r.what, r.phase, r.msg.Header[engine.HeaderTime])
				}
			}
		}
		t.Fatalf("values: %d outputs, want exactly %d (one per good record)", len(out), len(wantVals))
	}
	last := lastValues(t, out, "values", 16)
	for k, v := range wantVals {
		if got, ok := last[k]; !ok || got != string(v) {
			t.Errorf("values: key %.40q: output of %d bytes, want its value of %d bytes", k, len(got), len(v))
		}
	}
	// Dead letters: they are published at once, not with the checkpoint,
	// so the replay after the SIGKILL publishes those of the replayed
	// records again; their Nats-Msg-Id is the same, and the stream's
	// duplicate window keeps one. Every bad record has exactly one.
	figs := []string{}
	for _, p := range []*poisonJob{words, values} {
		f := checkDeadLetters(t, p, maxPayload, func(*poisonRec) bool { return true })
		figs = append(figs, f)
	}
	t.Logf("%s server, max_payload %d: %s; %s; %d words counted exactly over %d keys, %d values passed through; %.1fs",
		server, maxPayload, figs[0], figs[1], sum(model), len(model), len(wantVals), time.Since(t0).Seconds())
}

// readBigStream is readStream for streams of messages up to max_payload:
// it fetches a few at a time (a batch of thousands of 8 MiB messages is
// over the server's 64 MiB max_pending: it closes the connection as a slow
// consumer).
func readBigStream(t *testing.T, js jetstream.JetStream, stream string, want int) []jetstream.Msg {
	t.Helper()
	return readStreamBatch(t, js, stream, want, 4)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// checkWatermark: after the far-future records, the watermark is still
// near the wall clock, so later good records are not late.
func checkWatermark(t *testing.T, p *poisonJob, st engine.Stats) {
	t.Helper()
	if now := time.Now().UnixMilli(); st.Watermark > now || st.Watermark < now-10*60*1000 {
		t.Errorf("%s: watermark %d, want near the wall clock %d", p.name, st.Watermark, now)
	}
}

// checkDeadLetters reads the job's dead-letter stream and checks each dead
// letter against the record it names: expected stage, a reason, its
// input sequence, fits the server's max_payload, carries no Nats-*
// header, holds the record's headers (Nats-* renamed Cairn-Orig-Nats-*)
// and payload (or a prefix with Cairn-Truncated). Every bad record has at
// least one dead letter, exactly one where exact says so, and no good
// record has any. It returns the figures.
func checkDeadLetters(t *testing.T, p *poisonJob, maxPayload int, exact func(*poisonRec) bool) string {
	t.Helper()
	want := 0
	for _, r := range p.recs {
		if r.stage != "" {
			want++
		}
	}
	dls := readBigStream(t, p.js, "CAIRN_DLQ_"+strings.ToUpper(p.name), want)
	count := map[uint64]int{}
	truncated, biggest := 0, 0
	for _, m := range dls {
		h := m.Headers()
		seq, err := strconv.ParseUint(h.Get(engine.HeaderSeq), 10, 64)
		if err != nil || seq == 0 || seq > p.last() {
			t.Errorf("%s: dead letter with %s %q", p.name, engine.HeaderSeq, h.Get(engine.HeaderSeq))
			continue
		}
		r := p.recs[seq-1]
		count[seq]++
		fail := func(format string, a ...any) {
			t.Helper()
			t.Errorf("%s: dead letter of seq %d (%s, phase %d): %s", p.name, seq, r.what, r.phase, fmt.Sprintf(format, a...))
		}
		if r.stage == "" {
			fail("a good record was dead-lettered: %s: %s", h.Get(engine.HeaderStage), h.Get(engine.HeaderError))
			continue
		}
		if got := h.Get(engine.HeaderStage); got != r.stage {
			fail("stage %q, want %q (%s)", got, r.stage, h.Get(engine.HeaderError))
		}
		if h.Get(engine.HeaderError) == "" {
			fail("no %s", engine.HeaderError)
		}
		size := headerWire(h) + len(m.Data())
		biggest = max(biggest, size)
		if size > maxPayload {
			fail("%d bytes, over max_payload %d", size, maxPayload)
		}
		for k := range h {
			if k == engine.HeaderMsgID && strings.HasPrefix(h.Get(k), "cairn-dl/"+p.name+"/") {
				continue // its own id: a replay's copy is a duplicate
			}
			if len(k) >= 5 && strings.EqualFold(k[:5], "nats-") {
				fail("carries the producer's header %s", k)
			}
		}
		// The payload: whole, or a prefix with its original size.
		orig := r.dlVal
		if r.stage == "source" {
			orig = r.msg.Data
		}
		if tr := h.Get(engine.HeaderTruncated); tr != "" {
			truncated++
			if tr != strconv.Itoa(len(orig)) || len(m.Data()) >= len(orig) || !bytes.HasPrefix(orig, m.Data()) {
				fail("%s %s with %d bytes: not a prefix of the %d-byte original", engine.HeaderTruncated, tr, len(m.Data()), len(orig))
			}
		} else {
			if r.truncated {
				fail("no %s (payload %d bytes, max_payload %d)", engine.HeaderTruncated, len(m.Data()), maxPayload)
			}
			if !bytes.Equal(m.Data(), orig) {
				fail("payload of %d bytes, want the record's %d", len(m.Data()), len(orig))
			}
		}
		if r.stage == "source" {
			checkCopiedHeaders(h, r.msg.Header, fail)
			continue
		}
		if k := h.Get(engine.HeaderKey); k == "" || !strings.HasPrefix(r.dlKey, k) || (len(r.dlKey) <= 1024 && k != r.dlKey) {
			fail("%s of %d bytes is not the record's key of %d bytes (or a prefix)", engine.HeaderKey, len(k), len(r.dlKey))
		}
		if r.dlTime != "" && h.Get(engine.HeaderTime) != r.dlTime {
			fail("%s %q, want %q", engine.HeaderTime, h.Get(engine.HeaderTime), r.dlTime)
		}
	}
	bad, repeated := map[string]int{}, 0
	for _, r := range p.recs {
		if r.stage == "" {
			continue
		}
		bad[r.what]++
		n := count[r.seq]
		repeated += max(n-1, 0)
		switch {
		case n == 0:
			t.Errorf("%s: seq %d (%s, phase %d) has no dead letter", p.name, r.seq, r.what, r.phase)
		case n > 1 && exact(r):
			t.Errorf("%s: seq %d (%s, phase %d) has %d dead letters, want exactly 1", p.name, r.seq, r.what, r.phase, n)
		}
	}
	return fmt.Sprintf("%s: %d records, %d bad (%s) -> %d dead letters (%d repeats after the replay, %d truncated, largest %d bytes)",
		p.name, len(p.recs), want, figures(bad), len(dls), repeated, truncated, biggest)
}

// checkCopiedHeaders: a source dead letter holds the record's headers,
// Nats-* ones renamed Cairn-Orig-Nats-*, long values cut (and named in
// Cairn-Truncated-Headers), or says how many it dropped.
func checkCopiedHeaders(dl, orig nats.Header, fail func(string, ...any)) {
	if n := dl.Get(engine.HeaderHeadersDropped); n != "" {
		if n != strconv.Itoa(len(orig)) {
			fail("%s %s, the record had %d", engine.HeaderHeadersDropped, n, len(orig))
		}
		return
	}
	cut := strings.Split(dl.Get(engine.HeaderTruncatedHeaders), ",")
	for k, vs := range orig {
		name := k
		if strings.HasPrefix(strings.ToLower(k), "nats-") {
			name = engine.HeaderOrigPrefix + k
		}
		got := dl[name]
		if len(got) != len(vs) {
			fail("header %s: %d values, the record had %d", name, len(got), len(vs))
			continue
		}
		for i, v := range vs {
			if got[i] != v && (!strings.HasPrefix(v, got[i]) || !slices.Contains(cut, name)) {
				fail("header %s: value of %d bytes, the record's %d (cut ones: %v)", name, len(got[i]), len(v), cut)
			}
		}
	}
}

func figures(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	return b.String()
}
