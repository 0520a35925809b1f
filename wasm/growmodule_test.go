package wasm

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"cairn/operators/abi"
)

// growModule returns a hand-assembled operator module for the memory tests:
// it speaks ABI v1 (cairn_alloc bumps by memory.grow, cairn_process returns
// an empty output — after spinning as long as the i32 at address 8 is not
// 0 —, cairn_progress points at an idle progress word) and
// exports grow(pages i32) -> i32, which grows memory by pages and writes a
// byte to every 4 KiB of the new pages (as a guest filling its heap does),
// returning the previous size in pages or -1 when memory.grow fails. The
// memory starts at 2 pages; maxPages > 0 declares a maximum.
func growModule(maxPages uint32) []byte {
	const (
		progressAddr = 0  // the i32 progress word (ProgressIdle)
		spinAddr     = 8  // cairn_process spins while this i32 is not 0
		outputAddr   = 16 // the 1-byte empty output (the version)
	)
	var m []byte
	m = append(m, "\x00asm\x01\x00\x00\x00"...)
	section := func(id byte, body []byte) {
		m = append(m, id)
		m = appendU32(m, uint32(len(body)))
		m = append(m, body...)
	}
	const i32, i64 = 0x7f, 0x7e
	// Types: 0 (i32)->i32, 1 (i32)->i64, 2 ()->i32.
	section(1, []byte{3, 0x60, 1, i32, 1, i32, 0x60, 1, i32, 1, i64, 0x60, 0, 1, i32})
	// Functions: cairn_alloc, cairn_process, cairn_progress, grow.
	section(3, []byte{4, 0, 1, 2, 0})
	// Memory 0: min 2 pages, max maxPages when set.
	if maxPages > 0 {
		section(5, appendU32([]byte{1, 1, 2}, maxPages))
	} else {
		section(5, []byte{1, 0, 2})
	}
	var exp []byte
	exp = append(exp, 5)
	for _, e := range []struct {
		name string
		kind byte
		idx  byte
	}{{"memory", 2, 0}, {abi.ExportAlloc, 0, 0}, {abi.ExportProcess, 0, 1}, {abi.ExportProgress, 0, 2}, {"grow", 0, 3}} {
		exp = append(exp, byte(len(e.name)))
		exp = append(exp, e.name...)
		exp = append(exp, e.kind, e.idx)
	}
	section(7, exp)

	var code [][]byte
	// cairn_alloc(size): memory.grow((size+65535)>>16) << 16.
	code = append(code, []byte{0,
		0x20, 0, 0x41, 0xff, 0xff, 0x03, 0x6a, 0x41, 16, 0x76, 0x40, 0, 0x41, 16, 0x74, 0x0b})
	// cairn_process(len): spins while the i32 at spinAddr is not 0, then
	// returns (outputAddr << 32) | 1.
	code = append(code, append(appendS64([]byte{0,
		0x03, 0x40, 0x41, spinAddr, 0x28, 2, 0, 0x0d, 0, 0x0b, // loop; br_if 0 (load spinAddr); end
		0x42}, outputAddr<<32|1), 0x0b))
	// cairn_progress(): progressAddr.
	code = append(code, []byte{0, 0x41, progressAddr, 0x0b})
	// grow(pages), locals 1 old, 2 p, 3 end.
	code = append(code, []byte{1, 3, i32,
		0x20, 0, 0x40, 0, 0x22, 1, // old = memory.grow(pages)
		0x41, 0x7f, 0x46, 0x04, 0x40, 0x41, 0x7f, 0x0f, 0x0b, // if old == -1 { return -1 }
		0x20, 1, 0x41, 16, 0x74, 0x21, 2, // p = old << 16
		0x3f, 0, 0x41, 16, 0x74, 0x21, 3, // end = memory.size << 16
		0x02, 0x40, 0x03, 0x40, // block loop
		0x20, 2, 0x20, 3, 0x4f, 0x0d, 1, // br_if p >= end (out)
		0x20, 2, 0x41, 1, 0x3a, 0, 0, // *p = 1
		0x20, 2, 0x41, 0x80, 0x20, 0x6a, 0x21, 2, // p += 4096
		0x0c, 0, 0x0b, 0x0b, // br loop; end; end
		0x20, 1, 0x0b}) // old
	body := []byte{byte(len(code))}
	for _, c := range code {
		body = appendU32(body, uint32(len(c)))
		body = append(body, c...)
	}
	section(10, body)

	// Data: the idle progress word and the output's version byte.
	idle := uint32(int64(abi.ProgressIdle) & 0xffffffff)
	data := []byte{2,
		0, 0x41, progressAddr, 0x0b, 4, byte(idle), byte(idle >> 8), byte(idle >> 16), byte(idle >> 24),
		0, 0x41, outputAddr, 0x0b, 1, abi.Version}
	section(11, data)
	return m
}

func appendU32(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func appendS64(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// rss returns the process's resident set size in bytes (Linux: from
// /proc/self/statm), after a GC that returns freed heap memory to the OS,
// so that it counts what the process holds, not garbage waiting for the
// next cycle. ok is false where it cannot be read.
func rss() (n int64, ok bool) {
	debug.FreeOSMemory()
	return rssNoGC()
}

// rssNoGC is rss without the GC: what the process holds right now.
func rssNoGC() (n int64, ok bool) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, false
	}
	return pages * int64(os.Getpagesize()), true
}
