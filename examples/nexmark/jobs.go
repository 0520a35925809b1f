// Package nexmarkq holds the Nexmark queries as cairn jobs (the q*.yaml
// files beside it), for the tests that compare each with its model and for
// `cairn nexmark bench`.
package nexmarkq

import (
	"embed"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

//go:embed q*.yaml
var files embed.FS

// Queries returns the queries' names in order: q0, q1, ..., q22.
func Queries() []string {
	ents, _ := files.ReadDir(".")
	var names []string
	for _, e := range ents {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	slices.SortFunc(names, func(a, b string) int {
		x, _ := strconv.Atoi(a[1:])
		y, _ := strconv.Atoi(b[1:])
		return x - y
	})
	return names
}

// Job returns the job file of query name (for example "q5").
func Job(name string) ([]byte, error) {
	b, err := files.ReadFile(name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("nexmark: no query %q (have %s)", name, strings.Join(Queries(), ", "))
	}
	return b, nil
}
