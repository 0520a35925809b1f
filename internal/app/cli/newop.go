package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"cairn/operators"
)

// cmdNew writes a new operator project: `cairn new operator NAME --lang go`.
// The project builds with the language's toolchain alone and no network:
// the SDK's sources are written into it (cairn-sdk/) and go.mod replaces
// module "cairn" with that folder.
func cmdNew(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) < 2 || args[0] != "operator" {
		fmt.Fprintln(stderr, "Usage: cairn new operator NAME [--lang go] [--dir DIR]")
		return errors.New("what to create: cairn new operator NAME")
	}
	name := args[1]
	flags := newFlagSet("new operator", "cairn new operator NAME [--lang go] [--dir DIR]", stderr)
	lang := flags.String("lang", "go", "the operator's language (go; rust, c and as are planned)")
	dir := flags.String("dir", "", "the project folder (default ./NAME); it must not exist or be empty")
	if err := flags.Parse(args[2:]); err != nil {
		return err
	}
	if !regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`).MatchString(name) {
		return fmt.Errorf("operator name %q: use 1-64 lower-case letters, digits or '_', starting with a letter", name)
	}
	if *lang != "go" {
		return fmt.Errorf("--lang %s: only go is available in this version (rust, c and as are planned); the ABI is in docs/ABI.md for any language", *lang)
	}
	if *dir == "" {
		*dir = name
	}
	if ents, err := os.ReadDir(*dir); err == nil && len(ents) > 0 {
		return fmt.Errorf("%s exists and is not empty: choose another --dir", *dir)
	}
	files := map[string]string{
		"go.mod":           fmt.Sprintf(goModTemplate, name),
		"main.go":          strings.ReplaceAll(goMainTemplate, "NAME", name),
		"job.yaml":         strings.ReplaceAll(jobTemplate, "NAME", name),
		"input.jsonl":      inputTemplate,
		"build.sh":         strings.ReplaceAll(buildTemplate, "NAME", name),
		"README.md":        strings.ReplaceAll(readmeTemplate, "NAME", name),
		"cairn-sdk/go.mod": "module cairn\n\ngo 1.26\n",
	}
	for rel, body := range files {
		if err := writeFile(filepath.Join(*dir, rel), []byte(body)); err != nil {
			return err
		}
	}
	err := fs.WalkDir(operators.GoSDK, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := operators.GoSDK.ReadFile(p)
		if err != nil {
			return err
		}
		return writeFile(filepath.Join(*dir, "cairn-sdk", "operators", filepath.FromSlash(p)), b)
	})
	if err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(*dir, "build.sh"), 0o755); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote operator project %s (Go, SDK in cairn-sdk/, no network needed)\n\n  cd %s\n  ./build.sh                 # GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o %s.wasm\n  cairn test --job job.yaml --input input.jsonl --restore-every 3\n", *dir, *dir, name)
	return nil
}

func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

const goModTemplate = `module %s

go 1.26

require cairn v0.0.0

// The SDK ships in this project (cairn new wrote it from the cairn binary),
// so the build needs no network.
replace cairn => ./cairn-sdk
`

const goMainTemplate = `//go:build wasip1

// Command NAME is a keyed cairn operator: it keeps, per key, the sum of the
// numbers in the records' values (its state), and emits the running sum.
// Build: ./build.sh. Test: cairn test --job job.yaml --input input.jsonl.
package main

import (
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

func init() {
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			n, err := strconv.ParseInt(string(r.Value), 10, 64)
			if err != nil {
				return err // the record becomes a dead letter with this reason
			}
			// State lives in the host: read it, never keep it in a variable.
			var sum int64
			if v, ok := c.Get(""); ok {
				if sum, err = strconv.ParseInt(string(v), 10, 64); err != nil {
					return err
				}
			}
			sum += n
			out := strconv.AppendInt(nil, sum, 10)
			c.Put("", out)
			c.Emit(r.Key, out, r.Time)
			return nil
		},
	})
}
`

const jobTemplate = `# A job running NAME as its keyed stage. cairn test runs it with no
# broker; cairn run runs it on NATS (the embedded server by default).
name: NAME
input:  {stream: IN, subjects: ["in.>"]}
stages:
  - {name: NAME, module: NAME.wasm, keyed: true}
output: {stream: OUT, subject: out, delivery: exactly_once}
key_groups: 16
slots: 2
`

const inputTemplate = `{"key": "a", "value": "1", "time": 1700000000000}
{"key": "b", "value": "5", "time": 1700000000010}
{"key": "a", "value": "2", "time": 1700000000020}
{"key": "a", "value": "not a number", "time": 1700000000030}
{"key": "b", "value": "-1", "time": 1700000000040}
{"key": "c", "value": "7", "time": 1700000000050}
{"key": "a", "value": "3", "time": 1700000000060}
`

const buildTemplate = `#!/bin/sh
# Builds NAME.wasm with the Go toolchain alone (the SDK is in cairn-sdk/).
set -eu
cd "$(dirname "$0")"
GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 GOFLAGS=-mod=mod go build -buildmode=c-shared -trimpath -o NAME.wasm .
echo "built NAME.wasm"
`

const readmeTemplate = `# NAME

A keyed cairn operator in Go, written by ` + "`cairn new operator NAME`" + `.

- main.go: the operator: a running sum per key, in the key's state.
- cairn-sdk/: the cairn Go SDK (module "cairn", from the cairn binary): the build needs no network.
- job.yaml: a job with this operator as its keyed stage.
- input.jsonl: test records, one JSON object a line: key, value, time (Unix ms).

    ./build.sh
    cairn test --job job.yaml --input input.jsonl                      # outputs as JSON lines
    cairn test --job job.yaml --input input.jsonl --restore-every 3    # restore-safe?
    cairn test --job job.yaml --input input.jsonl --state              # the final state

The record "not a number" becomes a dead letter (printed on stderr): an operator's
error never stops a job. docs/ABI.md in the cairn repository describes the ABI for
any language.
`
