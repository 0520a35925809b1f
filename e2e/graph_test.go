package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/cli"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/testutil/wait"
)

// topWordsJob is a two-sub-topology graph: split + count (keyed by word),
// then rekey + top_n (keyed by one key), joined by a repartition stream.
func topWordsJob(t testing.TB, url, data, store string, slots int) string {
	return testJobYAML(t, topWordsSpec(url), data, store, slots)
}

// topWordsSpec is the top-words graph as a job: split, count by word, then
// the top 5 words of each 1 s window.
func topWordsSpec(url string) *job.Job {
	return &job.Job{
		Name: "topwords", NATS: url,
		Input: job.Input{Stream: "LINES", Subjects: []string{"lines.>"}},
		Stages: []job.Stage{
			{Name: "split", Module: "builtin:split"},
			{Name: "count", Module: "builtin:count", Keyed: true},
			{Name: "all", Module: "builtin:rekey"},
			{Name: "top", Module: "builtin:top_n", Keyed: true, Config: map[string]any{"n": 5, "size_ms": 1000}},
		},
		Output: job.Output{Stream: "TOP", Subject: "top", Delivery: "exactly_once"},
	}
}

// topWordsModel computes, from the lines in order, what top_n emits for
// each 1 s window: the words whose running count (over all lines so far)
// was last updated in the window, with that count, the 5 largest first
// (ties by word). Windows at or after last are left out (still open).
func topWordsModel(lines []string, times []int64, last int64) map[int64]string {
	total := map[string]int{}
	latest := map[int64]map[string]int{}
	for i, l := range lines {
		w := times[i] / 1000 * 1000
		for _, word := range strings.Fields(l) {
			total[word]++
			if latest[w] == nil {
				latest[w] = map[string]int{}
			}
			latest[w][word] = total[word]
		}
	}
	out := map[int64]string{}
	for w, m := range latest {
		if w+1000 > last {
			continue
		}
		type e struct {
			word string
			n    int
		}
		var es []e
		for word, n := range m {
			es = append(es, e{word, n})
		}
		sort.Slice(es, func(i, j int) bool {
			if es[i].n != es[j].n {
				return es[i].n > es[j].n
			}
			return es[i].word < es[j].word
		})
		var parts []string
		for _, x := range es[:min(5, len(es))] {
			parts = append(parts, fmt.Sprintf("%s=%d", x.word, x.n))
		}
		out[w] = fmt.Sprintf("%d:%s", w, strings.Join(parts, ","))
	}
	return out
}

// TestJobGraphTopWords runs word count -> top 5 words per second of event
// time as a job graph of two sub-topologies, crashes it (no final
// checkpoint: what was published stays, state rolls back to the last
// checkpoint) twice while input arrives, restarts it on other slot counts,
// and checks every closed window's top 5 is exactly the model's, each
// emitted once, with Cairn-Out gap-free on the output and on the
// repartition stream.
func TestJobGraphTopWords(t *testing.T) {
	rng := rand.New(rand.NewPCG(graphSeed(t), 1))
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "LINES", "lines.>")
	data, store := t.TempDir(), "file://"+t.TempDir()+"?create_dir=true"

	in := &lineInput{t: t, js: js, rng: rng, step: 7}
	publish := in.publish

	slots := []int{2, 3, 1}
	for round, n := range slots {
		publish(400)
		j, err := job.Parse([]byte(topWordsJob(t, url, data, store, n)))
		if err != nil {
			t.Fatal(err)
		}
		r, err := runtime.Start(context.Background(), j, runtime.Options{}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Downstream) != 1 {
			t.Fatalf("%d sub-topologies, want 2", 1+len(r.Downstream))
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		if round == len(slots)-1 {
			// The last round: a line far in the future closes every window
			// of the input before it, then a graceful stop.
			waitProcessed(t, r.Engine, uint64(len(in.lines)))
			in.closeWindows()
			model := topWordsModel(in.lines, in.times, in.times[len(in.times)-1])
			waitTopWindows(t, js, model, time.Minute, nil)
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			r.Close()
			checkTopWords(t, js, model)
			checkGraphLs(t, store)
			break
		}
		// Crash in the middle of the input: the downstream has consumed
		// some of the repartition stream, the upstream more of the input.
		waitProcessed(t, r.Engine, uint64(len(in.lines)-rng.IntN(300)))
		for _, s := range r.SubTopologies() {
			s.Engine.Kill()
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		r.Close()
	}
}

// waitTopWindows waits until TOP holds as many outputs as the model has
// closed windows; alive, when set, fails the test if the job died.
func waitTopWindows(t *testing.T, js jetstream.JetStream, model map[int64]string, within time.Duration, alive func()) {
	t.Helper()
	wait.Until(t, within, fmt.Sprintf("%d closed windows on TOP", len(model)), func() error {
		if alive != nil {
			alive()
		}
		if n := len(readStream(t, js, "TOP", 0)); n < len(model) {
			return fmt.Errorf("%d outputs", n)
		}
		return nil
	})
}

func checkTopWords(t *testing.T, js jetstream.JetStream, model map[int64]string) {
	t.Helper()
	checkTopOutputs(t, js, model)
	rp := readStream(t, js, "CAIRN_RP_TOPWORDS_1", 0)
	markers := checkRepartition(t, rp)
	t.Logf("%d windows exact; %d messages on the repartition stream (%d watermark markers)", len(model), len(rp), markers)
}

// checkTopOutputs is checkTopWords' check of the output stream alone.
func checkTopOutputs(t *testing.T, js jetstream.JetStream, model map[int64]string) {
	t.Helper()
	out := readStream(t, js, "TOP", len(model))
	lastValues(t, out, "top", 16) // Cairn-Out gap-free, one writer per key group
	got := map[int64]string{}
	for _, m := range out {
		v := string(m.Data())
		w, err := strconv.ParseInt(v[:strings.IndexByte(v, ':')], 10, 64)
		if err != nil {
			t.Fatalf("output %q", v)
		}
		if prev, dup := got[w]; dup {
			t.Fatalf("window %d emitted twice: %q and %q", w, prev, v)
		}
		got[w] = v
	}
	for w, want := range model {
		if got[w] != want {
			t.Errorf("window %d: got %q, want %q", w, got[w], want)
		}
	}
}

// checkRepartition checks a repartition stream: per key group, outputs
// numbered without gap or repeat (from 1, or from wherever a purge left the
// stream), watermarks that never go back, and markers that carry the key
// group's last output index.
func checkRepartition(t *testing.T, msgs []jetstream.Msg) (markers int) {
	t.Helper()
	last := map[string]uint64{}
	// Purged: messages are missing from the stream's start, or from
	// between two it holds (a two-input stage's stream is purged side by
	// side, each side's subjects on their own, so its first sequence can
	// stay 1 while one side's oldest are gone).
	purged := func() bool {
		var prev uint64
		for _, m := range msgs {
			md, err := m.Metadata()
			if err != nil {
				return false
			}
			if md.Sequence.Stream != prev+1 {
				return true
			}
			prev = md.Sequence.Stream
		}
		return false
	}()
	wm := map[string]int64{}
	for _, m := range msgs {
		h := m.Headers()
		idx, err := strconv.ParseUint(h.Get(engine.HeaderOut), 10, 64)
		if err != nil {
			t.Fatalf("%s: no %s: %v", m.Subject(), engine.HeaderOut, h)
		}
		if w := h.Get(engine.HeaderWatermark); w != "" {
			v, err := strconv.ParseInt(w, 10, 64)
			if err != nil {
				t.Fatalf("%s: %s=%q", m.Subject(), engine.HeaderWatermark, w)
			}
			if prev, ok := wm[m.Subject()]; ok && v < prev {
				t.Fatalf("%s: watermark went back from %d to %d", m.Subject(), prev, v)
			}
			wm[m.Subject()] = v
		}
		if _, seen := last[m.Subject()]; !seen && purged {
			// The first message left of this key group after a purge.
			last[m.Subject()] = idx
			if h.Get(engine.HeaderMarker) == "" {
				continue
			}
		}
		if h.Get(engine.HeaderMarker) != "" {
			markers++
			if idx != last[m.Subject()] {
				t.Fatalf("%s: marker says output %d after output %d", m.Subject(), idx, last[m.Subject()])
			}
			continue
		}
		if idx != last[m.Subject()]+1 {
			t.Fatalf("%s: output %d after %d", m.Subject(), idx, last[m.Subject()])
		}
		last[m.Subject()] = idx
	}
	return markers
}

// lineInput publishes lines of 1-4 words drawn skewed from a small
// vocabulary, with event times step ms apart, and remembers them for the
// model.
type lineInput struct {
	t     testing.TB
	js    jetstream.JetStream
	rng   *rand.Rand
	step  int64
	lines []string
	times []int64
}

var lineVocab = strings.Fields("ant bee cat dog eel fox gnu hen ibis jay kiwi lark mole newt owl pig")

func (in *lineInput) publish(n int) {
	var msgs []*nats.Msg
	for range n {
		var words []string
		for range 1 + in.rng.IntN(4) {
			// Skewed: low indexes are frequent.
			words = append(words, lineVocab[min(in.rng.IntN(len(lineVocab)), in.rng.IntN(len(lineVocab)))])
		}
		in.add(strings.Join(words, " "), 1_700_000_000_000+int64(len(in.lines))*in.step, &msgs)
	}
	publishAll(in.t, in.js, msgs)
}

// closeWindows publishes a line 5 s after the last: its watermark closes
// every window of the lines before it.
func (in *lineInput) closeWindows() {
	var msgs []*nats.Msg
	in.add("zzz", in.times[len(in.times)-1]+5000, &msgs)
	publishAll(in.t, in.js, msgs)
}

func (in *lineInput) add(line string, tm int64, msgs *[]*nats.Msg) {
	in.lines = append(in.lines, line)
	in.times = append(in.times, tm)
	*msgs = append(*msgs, &nats.Msg{Subject: "lines.x", Header: nats.Header{engine.HeaderTime: {strconv.FormatInt(tm, 10)}}, Data: []byte(line)})
}

// checkGraphLs: cairn checkpoints ls of a graph lists each sub-topology's
// chain with the stream it reads, in text and JSON, and show the
// sub-topologies with their newest checkpoints; gc covers each.
func checkGraphLs(t *testing.T, store string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := cli.Main([]string{"checkpoints", "ls", "--store", store, "--job", "topwords"}, &out, &errb); code != 0 {
		t.Fatalf("checkpoints ls: %d: %s", code, errb.String())
	}
	for _, want := range []string{"SUB-TOPOLOGY 0: topwords (reads LINES;", "SUB-TOPOLOGY 1: topwords.s1 (reads CAIRN_RP_TOPWORDS_1;"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("checkpoints ls has no %q:\n%s", want, out.String())
		}
	}
	// show of the first sub-topology lists every sub-topology too.
	out.Reset()
	if code := cli.Main([]string{"checkpoints", "show", "--store", store, "--job", "topwords"}, &out, &errb); code != 0 {
		t.Fatalf("checkpoints show: %d: %s", code, errb.String())
	}
	for _, want := range []string{"job graph topwords: 2 sub-topologies", "0 topwords: reads LINES; newest checkpoint", "1 topwords.s1: reads CAIRN_RP_TOPWORDS_1; newest checkpoint"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("checkpoints show has no %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := cli.Main([]string{"checkpoints", "ls", "--json", "--store", store, "--job", "topwords"}, &out, &errb); code != 0 {
		t.Fatalf("checkpoints ls --json: %d: %s", code, errb.String())
	}
	var ls struct {
		SubTopologies []struct {
			Name        string            `json:"name"`
			InputStream string            `json:"input_stream"`
			Checkpoints []json.RawMessage `json:"checkpoints"`
		} `json:"sub_topologies"`
	}
	if err := json.Unmarshal(out.Bytes(), &ls); err != nil || len(ls.SubTopologies) != 2 || ls.SubTopologies[1].Name != "topwords.s1" ||
		ls.SubTopologies[1].InputStream != "CAIRN_RP_TOPWORDS_1" || len(ls.SubTopologies[1].Checkpoints) == 0 {
		t.Fatalf("checkpoints ls --json: %v: %s", err, out.String())
	}
	out.Reset()
	if code := cli.Main([]string{"checkpoints", "gc", "--dry-run", "--store", store, "--job", "topwords"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "topwords.s1: would delete") {
		t.Fatalf("checkpoints gc: %d: %s%s", code, out.String(), errb.String())
	}
}
