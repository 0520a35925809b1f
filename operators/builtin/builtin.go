// Package builtin embeds the example operators of operators/examples,
// compiled to WebAssembly, so that the cairn binary runs them without a Go
// toolchain. Rebuild them with `go generate ./operators/builtin` (or
// build.sh) after changing an example or the SDK; TestBuiltinsUpToDate
// fails when an embedded copy is stale.
package builtin

import (
	"embed"
	"path"
	"sort"
	"strings"
)

//go:generate sh build.sh

//go:embed *.wasm
var files embed.FS

// Lookup returns the WebAssembly module of the example operator name
// (for example "count").
func Lookup(name string) ([]byte, bool) {
	if name == "" || strings.ContainsAny(name, "/.") {
		return nil, false
	}
	b, err := files.ReadFile(name + ".wasm")
	if err != nil {
		return nil, false
	}
	return b, true
}

// Names returns the names of the embedded operators, sorted.
func Names() []string {
	ents, _ := files.ReadDir(".")
	var names []string
	for _, e := range ents {
		names = append(names, strings.TrimSuffix(e.Name(), path.Ext(e.Name())))
	}
	sort.Strings(names)
	return names
}
