package demo

import (
	"math/rand/v2"
	"strings"
)

// Corpus is a deterministic synthetic text: the same seed gives the same
// lines, so a run's exact word counts can be checked against a model.
type Corpus struct {
	vocab []string
	rng   *rand.Rand
	zipf  *rand.Zipf
}

// NewCorpus makes a corpus of words drawn Zipf-skewed from a vocabulary of
// vocabSize synthetic words.
func NewCorpus(seed uint64, vocabSize int) *Corpus {
	syll := []string{"ka", "ro", "mi", "tu", "sen", "da", "li", "po", "ve", "nor", "ash", "qui", "ber", "lo", "zan", "fe"}
	vocab := make([]string, vocabSize)
	seen := map[string]bool{}
	g := rand.New(rand.NewPCG(seed, 0x5eed))
	for i := range vocab {
		for {
			var b strings.Builder
			n := 1 + g.IntN(3)
			for range n {
				b.WriteString(syll[g.IntN(len(syll))])
			}
			w := b.String()
			if !seen[w] {
				seen[w] = true
				vocab[i] = w
				break
			}
			if n == 3 { // allow longer words when short ones run out
				b.WriteString(syll[g.IntN(len(syll))])
				if w := b.String(); !seen[w] {
					seen[w] = true
					vocab[i] = w
					break
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0xc0ffee))
	return &Corpus{vocab: vocab, rng: rng, zipf: rand.NewZipf(rng, 1.1, 1, uint64(vocabSize-1))}
}

// Line returns the next line and its words.
func (c *Corpus) Line() (string, []string) {
	n := 4 + c.rng.IntN(9)
	words := make([]string, n)
	for i := range words {
		words[i] = c.vocab[c.zipf.Uint64()]
	}
	line := strings.Join(words, " ")
	if c.rng.IntN(4) == 0 { // some punctuation and capitals for split to clean
		line = strings.ToUpper(line[:1]) + line[1:] + "."
	}
	return line, words
}
