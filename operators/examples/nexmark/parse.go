//go:build wasip1

package main

import "errors"

// errInt is parseInt's and parseUint's one error: a sentinel, so a failed
// parse allocates nothing (strconv's error holds the string, which makes
// every strconv.ParseInt(string(b)) allocate the string in this guest).
var errInt = errors.New("nexmark: not a decimal integer")

// parseInt reads a decimal integer, an optional '-' first, of at most 18
// digits.
func parseInt(b []byte) (int64, error) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	n, err := parseUint(b)
	if neg {
		return -int64(n), err
	}
	return int64(n), err
}

// parseUint reads a decimal integer of at most 18 digits.
func parseUint(b []byte) (uint64, error) {
	if len(b) == 0 || len(b) > 18 {
		return 0, errInt
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errInt
		}
		n = n*10 + uint64(c-'0')
	}
	return n, nil
}

// parseInts reads up to len(dst) integers separated by sep into dst and
// returns how many there were; a field that is not an integer reads as 0.
func parseInts(b []byte, sep byte, dst []int64) int {
	n := 0
	for n < len(dst) {
		i := indexByte(b, sep)
		f := b
		if i >= 0 {
			f = b[:i]
		}
		dst[n], _ = parseInt(f)
		n++
		if i < 0 {
			break
		}
		b = b[i+1:]
	}
	return n
}
