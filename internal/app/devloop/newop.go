package devloop

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"cairn/internal/app/cmdline"
	"cairn/operators"
)

// NewCommand writes a new operator project: `cairn new operator NAME --lang
// go|rust|c|as`. The project builds with the language's toolchain alone and no
// network: the SDK's sources are written into it (cairn-sdk/); for Go,
// go.mod replaces module "cairn" with that folder.
func NewCommand(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) < 2 || args[0] != "operator" {
		fmt.Fprintln(stderr, "Usage: cairn new operator NAME [--lang go|rust|c|as] [--dir DIR]")
		return errors.New("what to create: cairn new operator NAME")
	}
	name := args[1]
	flags := cmdline.NewFlagSet("new operator", "cairn new operator NAME [--lang go|rust|c|as] [--dir DIR]", stderr)
	lang := flags.String("lang", "go", "the operator's language: go, rust (Debian's rustc, target wasm32-wasi), c (clang, wasi-libc) or as (AssemblyScript, npm package assemblyscript)")
	dir := flags.String("dir", "", "the project folder (default ./NAME); it must not exist or be empty")
	if err := flags.Parse(args[2:]); err != nil {
		return err
	}
	if !regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`).MatchString(name) {
		return fmt.Errorf("operator name %q: use 1-64 lower-case letters, digits or '_', starting with a letter", name)
	}
	p, ok := newProjects[*lang]
	if !ok {
		return fmt.Errorf("--lang %s: choose go, rust, c or as; the ABI is in docs/ABI.md for any language", *lang)
	}
	if *dir == "" {
		*dir = name
	}
	if ents, err := os.ReadDir(*dir); err == nil && len(ents) > 0 {
		return fmt.Errorf("%s exists and is not empty: choose another --dir", *dir)
	}
	files := map[string]string{
		"job.yaml":    strings.ReplaceAll(jobTemplate, "NAME", name),
		"input.jsonl": inputTemplate,
		"build.sh":    strings.ReplaceAll(p.build, "NAME", name),
		"README.md":   strings.ReplaceAll(p.readme, "NAME", name),
	}
	for rel, body := range p.files {
		files[strings.ReplaceAll(rel, "NAME", name)] = strings.ReplaceAll(body, "NAME", name)
	}
	for rel, body := range files {
		if err := writeFile(filepath.Join(*dir, rel), []byte(body)); err != nil {
			return err
		}
	}
	err := fs.WalkDir(p.sdk, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := p.sdk.ReadFile(path)
		if err != nil {
			return err
		}
		return writeFile(filepath.Join(*dir, "cairn-sdk", filepath.FromSlash(p.sdkPath(path))), b)
	})
	if err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(*dir, "build.sh"), 0o755); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote operator project %s (%s, SDK in cairn-sdk/, no network needed)\n\n  cd %s\n  ./build.sh                 # %s\n  cairn test --job job.yaml --input input.jsonl --restore-every 3\n",
		*dir, p.title, *dir, strings.ReplaceAll(p.buildHint, "NAME", name))
	if *lang == "as" && !haveASC(*dir) {
		fmt.Fprintln(stdout, "\nnote: the AssemblyScript compiler (asc) is not installed: npm install -g assemblyscript@0.28 (Node.js and npm from your system's packages), or npm install assemblyscript@0.28 in "+*dir)
	}
	if _, err := exec.LookPath("cairn"); err != nil {
		fmt.Fprintln(stdout, "\nnote: cairn is not on your PATH (as after go run): in the cairn repository, go build -o cairn . and put it on PATH, or go install . (into $(go env GOPATH)/bin)")
	}
	return nil
}

// haveASC reports whether build.sh will find the AssemblyScript compiler.
func haveASC(dir string) bool {
	if _, err := exec.LookPath("asc"); err == nil {
		return true
	}
	_, err := os.Stat(filepath.Join(dir, "node_modules", ".bin", "asc"))
	return err == nil
}

// newProject is what `cairn new operator` writes for one language, besides
// job.yaml and input.jsonl: files (NAME replaced), build.sh, README.md, and
// the SDK's embedded sources under cairn-sdk/ (at sdkPath of their path).
type newProject struct {
	title     string
	files     map[string]string
	build     string
	buildHint string
	readme    string
	sdk       embed.FS
	sdkPath   func(string) string
}

var newProjects = map[string]newProject{
	"go": {
		title: "Go",
		files: map[string]string{
			"go.mod":           goModTemplate,
			"main.go":          goMainTemplate,
			"cairn-sdk/go.mod": "module cairn\n\ngo 1.26\n",
		},
		build:     buildTemplate,
		buildHint: "GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o NAME.wasm",
		readme:    readmeTemplate,
		sdk:       operators.GoSDK,
		sdkPath:   func(p string) string { return path.Join("operators", p) },
	},
	"rust": {
		title:     "Rust",
		files:     map[string]string{"lib.rs": rustLibTemplate},
		build:     rustBuildTemplate,
		buildHint: "rustc --crate-type cdylib --target wasm32-wasi -o NAME.wasm lib.rs",
		readme:    rustReadmeTemplate,
		sdk:       operators.RustSDK,
		sdkPath:   func(p string) string { return path.Base(p) },
	},
	"c": {
		title:     "C",
		files:     map[string]string{"NAME.c": cMainTemplate},
		build:     cBuildTemplate,
		buildHint: "clang --target=wasm32-wasi -mexec-model=reactor -o NAME.wasm NAME.c cairn-sdk/cairn.c",
		readme:    cReadmeTemplate,
		sdk:       operators.CSDK,
		sdkPath:   func(p string) string { return path.Base(p) },
	},
	"as": {
		title:     "AssemblyScript",
		files:     map[string]string{"NAME.ts": asMainTemplate},
		build:     asBuildTemplate,
		buildHint: "asc NAME.ts --outFile NAME.wasm --optimize --exportStart _initialize --runtime minimal",
		readme:    asReadmeTemplate,
		sdk:       operators.ASSDK,
		sdkPath:   func(p string) string { return path.Base(p) },
	},
}

func init() {
	// The Rust build script carries the SDK's rustc function (which finds a
	// rustc with the wasm32-wasi standard library).
	fn, err := operators.RustSDK.ReadFile("sdk-rust/rustc.sh")
	if err != nil {
		panic(err)
	}
	p := newProjects["rust"]
	p.build = strings.Replace(p.build, "RUSTC_FUNCTION\n", string(fn), 1)
	newProjects["rust"] = p
}

func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

const goModTemplate = `module NAME

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

const rustLibTemplate = `//! NAME is a keyed cairn operator: it keeps, per key, the sum of the
//! numbers in the records' values (its state), and emits the running sum.
//! Build: ./build.sh. Test: cairn test --job job.yaml --input input.jsonl.

#[macro_use]
#[path = "cairn-sdk/cairn.rs"]
mod cairn;

use cairn::{Context, Operator, Record};

struct Sum;

impl Operator for Sum {
    fn on_record(&mut self, c: &mut Context, r: Record) -> cairn::Result {
        // An error makes the record a dead letter with its text.
        let n: i64 = std::str::from_utf8(r.value)?.parse()?;
        // State lives in the host: read it, never keep it in a field.
        let sum: i64 = match c.get(b"") {
            Some(v) => std::str::from_utf8(v)?.parse()?,
            None => 0,
        };
        let out = (sum + n).to_string();
        c.put(b"", out.as_bytes());
        c.emit(r.key, out.as_bytes(), r.time);
        Ok(())
    }
}

cairn_operator!(Sum);
`

const rustBuildTemplate = `#!/bin/sh
# Builds NAME.wasm with rustc alone (the SDK is in cairn-sdk/): no cargo, no
# crates, no network. On Debian: apt-get install rustc libstd-rust-dev-wasm32.
set -eu
cd "$(dirname "$0")"
RUSTC_FUNCTION
cairn_rustc -o NAME.wasm lib.rs
echo "built NAME.wasm"
`

const rustReadmeTemplate = `# NAME

A keyed cairn operator in Rust, written by ` + "`cairn new operator NAME --lang rust`" + `.

- lib.rs: the operator: a running sum per key, in the key's state.
- cairn-sdk/cairn.rs: the cairn Rust SDK (from the cairn binary; std only, no crates).
- build.sh: rustc for wasm32-wasi (Debian: ` + "`apt-get install rustc libstd-rust-dev-wasm32`" + `), no cargo, no network.
- job.yaml: a job with this operator as its keyed stage.
- input.jsonl: test records, one JSON object a line: key, value, time (Unix ms).

    ./build.sh
    cairn test --job job.yaml --input input.jsonl                      # outputs as JSON lines
    cairn test --job job.yaml --input input.jsonl --restore-every 3    # restore-safe?
    cairn test --job job.yaml --input input.jsonl --state              # the final state

The record "not a number" becomes a dead letter (printed on stderr): an operator's
error never stops a job. docs/LANGUAGES.md and docs/ABI.md in the cairn repository
describe the SDK and the ABI.
`

const cMainTemplate = `/*
 * NAME is a keyed cairn operator: it keeps, per key, the sum of the numbers
 * in the records' values (its state), and emits the running sum.
 * Build: ./build.sh. Test: cairn test --job job.yaml --input input.jsonl.
 */
#include "cairn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* parse_i64 parses decimal text; false when it is not a number. */
static bool parse_i64(cairn_bytes b, int64_t *n) {
	char tmp[32], *end;
	if (b.len == 0 || b.len >= sizeof tmp) return false;
	memcpy(tmp, b.data, b.len);
	tmp[b.len] = 0;
	errno = 0;
	*n = strtoll(tmp, &end, 10);
	return *end == 0 && errno == 0;
}

static int on_record(cairn_ctx *c, const cairn_record *r) {
	int64_t n, sum = 0;
	if (!parse_i64(r->value, &n)) {
		return cairn_error(c, "the value is not a number"); /* a dead letter */
	}
	/* State lives in the host: read it, never keep it in a global. */
	cairn_bytes v;
	if (cairn_get(c, "", 0, &v) && !parse_i64(v, &sum)) {
		return cairn_error(c, "corrupt state");
	}
	sum += n;
	char out[24];
	int len = snprintf(out, sizeof out, "%lld", (long long)sum);
	cairn_put(c, "", 0, out, (size_t)len);
	cairn_emit(c, r->key.data, r->key.len, out, (size_t)len, r->time);
	return CAIRN_OK;
}

CAIRN_OPERATOR(on_record, NULL)
`

const cBuildTemplate = `#!/bin/sh
# Builds NAME.wasm with clang for wasm32-wasi (the SDK is in cairn-sdk/), no
# network. On Debian: apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32.
set -eu
cd "$(dirname "$0")"
${CC:-clang} --target=wasm32-wasi -mexec-model=reactor -O2 -Wall -I cairn-sdk \
  -Wl,--strip-all -o NAME.wasm NAME.c cairn-sdk/cairn.c
echo "built NAME.wasm"
`

const cReadmeTemplate = `# NAME

A keyed cairn operator in C, written by ` + "`cairn new operator NAME --lang c`" + `.

- NAME.c: the operator: a running sum per key, in the key's state.
- cairn-sdk/: the cairn C SDK, cairn.h and cairn.c (from the cairn binary; wasi-libc only).
- build.sh: clang for wasm32-wasi (Debian: ` + "`apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32`" + `), no network.
- job.yaml: a job with this operator as its keyed stage.
- input.jsonl: test records, one JSON object a line: key, value, time (Unix ms).

    ./build.sh
    cairn test --job job.yaml --input input.jsonl                      # outputs as JSON lines
    cairn test --job job.yaml --input input.jsonl --restore-every 3    # restore-safe?
    cairn test --job job.yaml --input input.jsonl --state              # the final state

The record "not a number" becomes a dead letter (printed on stderr): an operator's
error never stops a job. docs/LANGUAGES.md and docs/ABI.md in the cairn repository
describe the SDK and the ABI.
`

const asMainTemplate = `// NAME is a keyed cairn operator: it keeps, per key, the sum of the
// numbers in the records' values (its state), and emits the running sum.
// Build: ./build.sh. Test: cairn test --job job.yaml --input input.jsonl.
import { Context, Record, register, str, utf8 } from "./cairn-sdk/cairn";
export { cairn_alloc, cairn_process, cairn_progress } from "./cairn-sdk/cairn";

/** parseI64 parses decimal text; i64.MIN_VALUE when it is not a number. */
function parseI64(s: string): i64 {
  let n: i64 = 0;
  let neg = s.startsWith("-");
  const digits = neg ? s.substring(1) : s;
  if (digits.length == 0 || digits.length > 18) return i64.MIN_VALUE;
  for (let i = 0; i < digits.length; i++) {
    const d = digits.charCodeAt(i) - 48;
    if (d < 0 || d > 9) return i64.MIN_VALUE;
    n = n * 10 + d;
  }
  return neg ? -n : n;
}

function onRecord(c: Context, r: Record): bool {
  const n = parseI64(str(r.value));
  if (n == i64.MIN_VALUE) return c.error("the value is not a number"); // a dead letter
  // State lives in the host: read it, never keep it in a global.
  let sum: i64 = 0;
  const v = c.get("");
  if (v) {
    sum = parseI64(str(v));
    if (sum == i64.MIN_VALUE) return c.error("corrupt state");
  }
  const out = utf8((sum + n).toString());
  c.put("", out);
  c.emit(r.key, out, r.time);
  return true;
}

register(onRecord);
`

const asBuildTemplate = `#!/bin/sh
# Builds NAME.wasm with the AssemblyScript compiler (the SDK is in
# cairn-sdk/), no network: npm install -g assemblyscript@0.28 once, or have
# it in ./node_modules.
set -eu
cd "$(dirname "$0")"
if command -v asc >/dev/null 2>&1; then
  ASC=asc
elif [ -x node_modules/.bin/asc ]; then
  ASC=node_modules/.bin/asc
else
  echo "build.sh: the AssemblyScript compiler (asc) is not installed: npm install -g assemblyscript@0.28 (Node.js and npm from your system's packages), or npm install assemblyscript@0.28 here" >&2
  exit 1
fi
$ASC NAME.ts --outFile NAME.wasm --optimize --exportStart _initialize --runtime minimal \
  --use abort=cairn-sdk/cairn/cairnAbort
echo "built NAME.wasm"
`

const asReadmeTemplate = `# NAME

A keyed cairn operator in AssemblyScript, written by ` + "`cairn new operator NAME --lang as`" + `.

- NAME.ts: the operator: a running sum per key, in the key's state.
- cairn-sdk/cairn.ts: the cairn AssemblyScript SDK (from the cairn binary; no dependencies).
- build.sh: asc (` + "`npm install -g assemblyscript@0.28`" + `), no network.
- job.yaml: a job with this operator as its keyed stage.
- input.jsonl: test records, one JSON object a line: key, value, time (Unix ms).

    ./build.sh
    cairn test --job job.yaml --input input.jsonl                      # outputs as JSON lines
    cairn test --job job.yaml --input input.jsonl --restore-every 3    # restore-safe?
    cairn test --job job.yaml --input input.jsonl --state              # the final state

The record "not a number" becomes a dead letter (printed on stderr): an operator's
error never stops a job. docs/LANGUAGES.md and docs/ABI.md in the cairn repository
describe the SDK and the ABI.
`
