package e2e

import (
	"cairn/internal/app/demo"
	"fmt"
	"strings"
	"testing"
	"unicode"

	"github.com/nats-io/nats.go"
)

// splitWords is the model of the builtin split operator.
func splitWords(line string) []string {
	var out []string
	for _, f := range strings.Fields(line) {
		w := strings.ToLower(strings.Map(func(r rune) rune {
			if unicode.IsLetter(r) || unicode.IsDigit(r) {
				return r
			}
			return -1
		}, f))
		if w != "" {
			out = append(out, w)
		}
	}
	return out
}

// lineCorpus makes n lines of the synthetic corpus as messages on
// lines.in, and the model of the word counts split -> count must produce.
func lineCorpus(seed uint64, vocab, n int) ([]*nats.Msg, map[string]int) {
	corpus := demo.NewCorpus(seed, vocab)
	model := map[string]int{}
	msgs := make([]*nats.Msg, 0, n)
	for range n {
		line, _ := corpus.Line()
		for _, w := range splitWords(line) {
			model[w]++
		}
		msgs = append(msgs, &nats.Msg{Subject: "lines.in", Data: []byte(line)})
	}
	return msgs, model
}

const wordcountJob = `
name: wordcount
nats: %s
input:  {stream: LINES, subjects: ["lines.>"]}
stages:
  - {name: split, module: "builtin:split"}
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: COUNTS, subject: counts, delivery: %s}
key_groups: 128
slots: %d
data_dir: %s
batch_size: 256
`

// TestWordcountExact publishes a known corpus, runs split -> count and
// checks the exact final count of every word in the output stream (last
// value per key, with gap-free output indexes per key group) and in the state.
func TestWordcountExact(t *testing.T) {
	for _, tc := range []struct {
		delivery string
		slots    int
	}{{"exactly_once", 3}, {"dedupe", 1}} {
		t.Run(fmt.Sprintf("%s-%dslots", tc.delivery, tc.slots), func(t *testing.T) {
			url := startNATS(t)
			_, js := connectJS(t, url)
			createStream(t, js, "LINES", "lines.>")
			const lines = 3000
			msgs, model := lineCorpus(7, 800, lines)
			publishAll(t, js, msgs)

			dir := t.TempDir()
			r, stop := runJob(t, fmt.Sprintf(wordcountJob, url, tc.delivery, tc.slots, dir))
			waitProcessed(t, r.Engine, lines)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			checkOutputs(t, js, "COUNTS", "counts", 128, model)
			checkState(t, dir, 128, tc.slots, model)
		})
	}
}
