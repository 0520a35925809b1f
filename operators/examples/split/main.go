//go:build wasip1

// Command split is a stateless operator: each record's value is a line of
// text, and it emits one record per word, keyed by the word in lower case
// with punctuation stripped, with value "1" and the record's time.
package main

import (
	"bytes"
	"unicode"

	"cairn/operators/sdk"
)

func main() {}

func init() {
	one := []byte("1")
	var word []byte
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			for _, f := range bytes.Fields(r.Value) {
				word = word[:0]
				for _, ch := range string(f) {
					if unicode.IsLetter(ch) || unicode.IsDigit(ch) {
						word = append(word, string(unicode.ToLower(ch))...)
					}
				}
				if len(word) > 0 {
					c.Emit(word, one, r.Time)
				}
			}
			return nil
		},
	})
}
