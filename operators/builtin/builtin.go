// Package builtin embeds the example operators of operators/examples,
// compiled to WebAssembly, so that the cairn binary runs them without a Go
// toolchain. Rebuild them with `go generate ./operators/builtin` (or
// build.sh) after changing an example or the SDK; TestBuiltinsUpToDate
// fails when an embedded copy is stale.
package builtin

import (
	"embed"
	"sort"
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"
)

//go:generate sh build.sh

// The modules are stored zstd-compressed (build.sh runs ./pack): each Go
// module carries its own runtime, and seven of them were 19 MiB of the
// binary uncompressed, 5 MiB compressed one by one. Every module but the
// base (baseName) is compressed with the base module's bytes as a raw
// dictionary, so each adds only what differs from it (pack/main.go).
//
//go:embed *.wasm.zst
var files embed.FS

const ext = ".wasm.zst"

// baseName and dictID must match pack's.
const (
	baseName = "window_count"
	dictID   = 1
)

// decoder decodes the base module alone, then returns a decoder that knows
// it as the dictionary of the others.
var decoder = sync.OnceValue(func() *zstd.Decoder {
	plain, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		panic(err) // only for invalid options
	}
	defer plain.Close()
	z, err := files.ReadFile(baseName + ext)
	if err != nil {
		panic(err) // embedded: TestNames reads every module
	}
	base, err := plain.DecodeAll(z, nil)
	if err != nil {
		panic(err)
	}
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderDictRaw(dictID, base))
	if err != nil {
		panic(err)
	}
	return d
})

// Lookup returns the WebAssembly module of the example operator name
// (for example "count").
func Lookup(name string) ([]byte, bool) {
	if name == "" || strings.ContainsAny(name, "/.") {
		return nil, false
	}
	z, err := files.ReadFile(name + ext)
	if err != nil {
		return nil, false
	}
	b, err := decoder().DecodeAll(z, nil)
	if err != nil {
		return nil, false // not reachable: TestBuiltinsUpToDate decodes every one
	}
	return b, true
}

// Names returns the names of the embedded operators, sorted.
func Names() []string {
	ents, _ := files.ReadDir(".")
	var names []string
	for _, e := range ents {
		names = append(names, strings.TrimSuffix(e.Name(), ext))
	}
	sort.Strings(names)
	return names
}
