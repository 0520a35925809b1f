package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/engine"
	"cairn/internal/testutil/langtool"
	"cairn/internal/testutil/testbin"
	"cairn/operators/builtin"
	"cairn/wasm"
)

// TestLanguagesKillNine builds the count example of each SDK other than
// Go's (operators/examples-rust, examples-c, examples-as) with its real
// toolchain, and runs it through the exactly-once test of the Go builtins
// (TestKillNine's killCase: six SIGKILLs while the input arrives), then a
// restart rescaled from 2 slots to 3 that is killed once more, and a run to
// the end at 3 slots: exact counts per key, Cairn-Out gap-free per key
// group, and every key's state equal to its count. A missing toolchain
// skips its language (.ci/run installs them). Seeded: CAIRN_KILL_SEED.
// languageRuns runs the operator languages' jobs under SIGKILL and their
// examples against the Go ones: over a minute with every toolchain present,
// so go test ./... leaves them to .ci/run, which installs the toolchains
// and runs them on their own.
var languageRuns = flag.Bool("cairn.languages", false, "run the Rust, C and AssemblyScript operators' kill, example and migration tests (minutes); .ci/run runs them")

func needLanguageRuns(t *testing.T) {
	t.Helper()
	if !*languageRuns {
		t.Skip("the languages' job runs: run with -cairn.languages (.ci/run does)")
	}
}

func TestLanguagesKillNine(t *testing.T) {
	needLanguageRuns(t)
	seed := killSeed()
	for i, lang := range []struct {
		name  string
		probe func() error
		build string // the examples' build script, from e2e/
	}{
		{"rust", langtool.Rust, "../operators/examples-rust/build.sh"},
		{"c", langtool.C, "../operators/examples-c/build.sh"},
		{"as", langtool.AS, "../operators/examples-as/build.sh"},
	} {
		t.Run(lang.name, func(t *testing.T) {
			if err := lang.probe(); err != nil {
				t.Skipf("the %s toolchain is missing: %v", lang.name, err)
			}
			t.Logf("seed %d (rerun: CAIRN_KILL_SEED=%d go test ./e2e -run 'TestLanguagesKillNine/%s' -count=1)", seed, seed, lang.name)
			out := t.TempDir()
			t0 := time.Now()
			if b, err := exec.Command(lang.build, out).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", lang.build, err, b)
			}
			module := filepath.Join(out, "count.wasm")
			st, err := os.Stat(module)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("built the %s examples in %v; count.wasm is %d bytes", lang.name, time.Since(t0).Round(time.Millisecond), st.Size())
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			h := newHarness(t, harnessConfig{op: opCount, module: module, store: "file", mode: "incremental", delivery: "exactly_once", interval: "150ms"})
			kills := killCase(t, rng, h)
			// A restart on 3 slots (the checkpoint is of 2): killed while
			// more input arrives, then run to the end at 3 slots.
			h.args = []string{"--slots", "3"}
			h.cfg.slots = 3
			cmd, done := h.start()
			time.Sleep(time.Duration(300+rng.IntN(800)) * time.Millisecond)
			h.publish(1500)
			select {
			case err := <-done:
				t.Fatalf("cairn exited before the kill: %v\n%s", err, tail(h.logs.String(), 4000))
			default:
			}
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
			kills++
			h.runToEnd()
			m := h.verify()
			t.Logf("%s count: %d SIGKILLs, a rescale 2 -> 3 slots, %d events, %d outputs exact", lang.name, kills, m.events, m.outputs)
		})
	}
}

// TestLanguagesNewProject is the promise to operator authors: with only the cairn binary
// and one language's toolchain, `cairn new operator` to a passing `cairn
// test --restore-every` in under five minutes, for each language, with
// the network off for Go (GOPROXY=off, an empty module cache).
func TestLanguagesNewProject(t *testing.T) {
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	for _, lang := range []struct {
		name  string
		probe func() error
	}{
		{"go", func() error { return nil }},
		{"rust", langtool.Rust},
		{"c", langtool.C},
		{"as", langtool.AS},
	} {
		t.Run(lang.name, func(t *testing.T) {
			if err := lang.probe(); err != nil {
				t.Skipf("the %s toolchain is missing: %v", lang.name, err)
			}
			t0 := time.Now()
			work := t.TempDir()
			run := func(dir, name string, args ...string) string {
				t.Helper()
				cmd := exec.Command(name, args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off", "GOMODCACHE="+filepath.Join(work, "modcache"), "GOFLAGS=")
				b, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
				}
				return string(b)
			}
			run(work, bin, "new", "operator", "summer", "--lang", lang.name)
			dir := filepath.Join(work, "summer")
			run(dir, "./build.sh")
			out := run(dir, bin, "test", "--job", "job.yaml", "--input", "input.jsonl", "--restore-every", "3")
			for _, want := range []string{`"key":"a","value":"6"`, `"key":"b","value":"4"`, `"key":"c","value":"7"`, "dead letter: seq 4", "identical to an uninterrupted run"} {
				if !strings.Contains(out, want) {
					t.Errorf("cairn test output lacks %s:\n%s", want, out)
				}
			}
			if d := time.Since(t0); d > 5*time.Minute {
				t.Errorf("cairn new to a passing cairn test took %v, over five minutes", d)
			} else {
				t.Logf("%s: cairn new, build.sh, cairn test --restore-every 3 in %v", lang.name, d.Round(time.Millisecond))
			}
		})
	}
}

// BenchmarkOperatorCountLanguages runs the keyed count of each SDK on the
// path of BenchmarkOperatorCount (batches of 1024 Zipf-skewed keys, state
// in a real Pebble DB), deadline off and on: the Go SDK's builtin:count as
// the baseline, then the Rust, C and AssemblyScript examples built with
// their toolchains (skipped when missing). Reports ns/record; logs each
// module's size.
func BenchmarkOperatorCountLanguages(b *testing.B) {
	ctx := context.Background()
	rt, err := wasm.NewRuntime(ctx, wasm.RuntimeConfig{CacheDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close(ctx)
	goCount, _ := builtin.Lookup("count")
	langs := []struct {
		name  string
		probe func() error
		build string
		code  []byte
	}{
		{name: "go", code: goCount},
		{"rust", langtool.Rust, "../operators/examples-rust/build.sh", nil},
		{"c", langtool.C, "../operators/examples-c/build.sh", nil},
		{"as", langtool.AS, "../operators/examples-as/build.sh", nil},
	}
	for _, l := range langs {
		if l.code == nil {
			if err := l.probe(); err != nil {
				b.Logf("%s: skipped: %v", l.name, err)
				continue
			}
			out := b.TempDir()
			if o, err := exec.Command(l.build, out).CombinedOutput(); err != nil {
				b.Fatalf("%s: %v\n%s", l.build, err, o)
			}
			if l.code, err = os.ReadFile(filepath.Join(out, "count.wasm")); err != nil {
				b.Fatal(err)
			}
		}
		mod, err := rt.Compile(ctx, l.name+"-count", l.code)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("%s: count.wasm is %d bytes", l.name, len(l.code))
		benchCountOp(b, l.name+"-deadline-off", func() (engine.Operator, error) {
			return mod.Instantiate(ctx, wasm.InstanceConfig{Stage: "count", Slot: 0})
		})
		benchCountOp(b, l.name+"-deadline-5s", func() (engine.Operator, error) {
			return mod.Instantiate(ctx, wasm.InstanceConfig{Stage: "count", Slot: 0, Deadline: 5e9})
		})
	}
}

// TestLanguagesExamples builds the Rust, C and AssemblyScript examples and runs them with
// `cairn test --restore-every` (restores on other slot counts in between)
// in the jobs the Go builtins run in, over the same records: split ->
// window_count by event time, split -> window_count by processing time
// (with logged ticks), and count. The outputs must equal the builtins'
// line for line: the ports behave as the Go originals, config, timers of
// both kinds, scan and delete included.
func TestLanguagesExamples(t *testing.T) {
	needLanguageRuns(t)
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var recs strings.Builder
	lines := []string{"Hello, World!", "the world", "HELLO hello", "Déjà vu, the 2nd"}
	for i := range 120 {
		fmt.Fprintf(&recs, `{"key": "k%d", "value": %q, "time": %d, "ts": %d}`+"\n", i%7, lines[i%len(lines)], 1700000000000+int64(i*13-(i*7919)%40), 1700000000000+int64(i*11))
		if i%30 == 29 {
			fmt.Fprintf(&recs, `{"tick": true, "ts": %d}`+"\n", 1700000000000+int64(i*11+200))
		}
	}
	input := filepath.Join(dir, "input.jsonl")
	if err := os.WriteFile(input, []byte(recs.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	jobs := map[string]string{
		"window-event": "  - {name: split, module: %s}\n  - {name: win, module: %s, keyed: true, config: {size_ms: 100, time: event}}",
		"window-proc":  "  - {name: split, module: %s}\n  - {name: win, module: %s, keyed: true, config: {size_ms: 50, time: processing}}",
		"count":        "  - {name: split, module: %s}\n  - {name: count, module: %s, keyed: true}",
	}
	examples := map[string]string{"window-event": "window_count", "window-proc": "window_count", "count": "count"}
	run := func(name, stages string) string {
		t.Helper()
		job := filepath.Join(dir, name+".yaml")
		body := "name: ex\ninput: {stream: IN, subjects: [\"in.>\"]}\nstages:\n" + stages + "\noutput: {stream: OUT, subject: out, delivery: exactly_once}\nkey_groups: 16\nslots: 2\nwatermark: {max_out_of_orderness: 50ms}\n"
		if err := os.WriteFile(job, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "test", "--job", job, "--input", input, "--restore-every", "25")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || !strings.Contains(stderr.String(), "identical to an uninterrupted run") {
			t.Fatalf("cairn test %s: %v\n%s", name, err, stderr.String())
		}
		return string(out)
	}
	want := map[string]string{}
	for name, stages := range jobs {
		want[name] = run("go-"+name, fmt.Sprintf(stages, `"builtin:split"`, `"builtin:`+examples[name]+`"`))
		if n := strings.Count(want[name], "\n"); n < 20 {
			t.Fatalf("%s: only %d outputs from the builtins:\n%s", name, n, want[name])
		}
	}
	for _, lang := range []struct {
		name  string
		probe func() error
		build string
	}{
		{"rust", langtool.Rust, "../operators/examples-rust/build.sh"},
		{"c", langtool.C, "../operators/examples-c/build.sh"},
		{"as", langtool.AS, "../operators/examples-as/build.sh"},
	} {
		t.Run(lang.name, func(t *testing.T) {
			if err := lang.probe(); err != nil {
				t.Skipf("the %s toolchain is missing: %v", lang.name, err)
			}
			out := filepath.Join(dir, lang.name)
			if err := os.Mkdir(out, 0o755); err != nil {
				t.Fatal(err)
			}
			if b, err := exec.Command(lang.build, out).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", lang.build, err, b)
			}
			for name, stages := range jobs {
				got := run(lang.name+"-"+name, fmt.Sprintf(stages, strconv.Quote(filepath.Join(out, "split.wasm")), strconv.Quote(filepath.Join(out, examples[name]+".wasm"))))
				if got != want[name] {
					t.Errorf("%s %s: the outputs differ from the Go builtins'\n--- go\n%s--- %s\n%s", lang.name, name, want[name], lang.name, got)
				}
			}
		})
	}
}

// TestLanguagesSDKCheck runs the SDK checkers (testdata/sdkcheck: the same
// operator in Go, Rust, C and AssemblyScript, driven by commands in the records: state
// get/put/delete/scan with values larger than the SDKs' first buffers,
// both timer kinds registered and deleted, processing clock, config, key,
// logs, an emit under another key, an error and a crash) with `cairn test
// --restore-every 10 --state`. All must give the same outputs, final
// state and dead letters, and pass the restore check.
func TestLanguagesSDKCheck(t *testing.T) {
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const t0 = 1700000000000
	var in strings.Builder
	i := 0
	add := func(key, cmd string) {
		fmt.Fprintf(&in, `{"key": %q, "value": %q, "time": %d, "ts": %d}`+"\n", key, cmd, t0+i*5, t0+i*5)
		i++
	}
	for _, k := range []string{"a", "b", "c"} {
		for _, cmd := range []string{"get -", "put - 5", "get -", "put x1 5000", "put x2 3", "put y 7", "scan -", "scan x", "del x2", "scan -", "get x1", "get zz",
			fmt.Sprintf("etimer %d", t0+400), fmt.Sprintf("etimer %d", t0+450), fmt.Sprintf("edel %d", t0+450),
			fmt.Sprintf("ptimer %d", t0+600), fmt.Sprintf("ptimer %d", t0+650), fmt.Sprintf("pdel %d", t0+650),
			"info", "log", "rekey moved-" + k, "fail", "crash"} {
			add(k, cmd)
		}
	}
	for _, k := range []string{"a", "b", "c"} {
		for _, cmd := range []string{"get x1", "scan x", "scan -", "del -", "get -", "put big 9000", "scan b"} {
			add(k, cmd)
		}
	}
	fmt.Fprintf(&in, `{"tick": true, "ts": %d}`+"\n", t0+2000)
	fmt.Fprintf(&in, `{"key": "z", "value": "info", "time": %d, "ts": %d}`+"\n", t0+3000, t0+3000)
	input := filepath.Join(dir, "input.jsonl")
	if err := os.WriteFile(input, []byte(in.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	build := map[string][]string{
		"go":   {"go", "build", "-buildmode=c-shared", "-trimpath", "-o", "OUT", "./testdata/sdkcheck/go"},
		"rust": {"sh", "-c", `. ../operators/sdk-rust/rustc.sh && cairn_rustc -o OUT testdata/sdkcheck/rust/lib.rs`},
		"c":    {"clang", "--target=wasm32-wasi", "-mexec-model=reactor", "-O2", "-Wall", "-I", "../operators/sdk-c", "-o", "OUT", "testdata/sdkcheck/c/sdkcheck.c", "../operators/sdk-c/cairn.c"},
		"as":   {"asc", "testdata/sdkcheck/as/sdkcheck.ts", "--outFile", "OUT", "--optimize", "--exportStart", "_initialize", "--runtime", "minimal", "--use", "abort=../operators/sdk-as/cairn/cairnAbort"},
	}
	type result struct{ out, dead string }
	results := map[string]result{}
	for _, lang := range []struct {
		name  string
		probe func() error
	}{
		{"go", func() error { return nil }},
		{"rust", langtool.Rust},
		{"c", langtool.C},
		{"as", langtool.AS},
	} {
		if err := lang.probe(); err != nil {
			t.Logf("%s skipped: the toolchain is missing: %v", lang.name, err)
			continue
		}
		module := filepath.Join(dir, lang.name+".wasm")
		args := build[lang.name]
		for j := range args {
			args[j] = strings.ReplaceAll(args[j], "OUT", module)
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build the %s checker: %v\n%s", lang.name, err, b)
		}
		job := filepath.Join(dir, lang.name+".yaml")
		body := fmt.Sprintf("name: chk\ninput: {stream: IN, subjects: [\"in.>\"]}\nstages:\n  - {name: chk, module: %q, keyed: true, config: {hello: 1}}\noutput: {stream: OUT, subject: out, delivery: exactly_once}\nkey_groups: 16\nslots: 2\nwatermark: {max_out_of_orderness: 10ms}\n", module)
		if err := os.WriteFile(job, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		run := exec.Command(bin, "test", "--job", job, "--input", input, "--restore-every", "10", "--state")
		var stderr strings.Builder
		run.Stderr = &stderr
		out, err := run.Output()
		if err != nil || !strings.Contains(stderr.String(), "identical to an uninterrupted run") {
			t.Fatalf("%s: cairn test: %v\n%s", lang.name, err, stderr.String())
		}
		var dead []string
		for _, l := range strings.Split(stderr.String(), "\n") {
			if strings.HasPrefix(l, "dead letter: ") {
				seq, _, _ := strings.Cut(strings.TrimPrefix(l, "dead letter: "), " stage")
				if strings.Contains(l, "failed on purpose") {
					seq += " (error)"
				}
				dead = append(dead, seq)
			}
		}
		results[lang.name] = result{string(out), strings.Join(dead, ", ")}
	}
	ref := results["go"]
	for _, want := range []string{`"value":"-=absent"`, `"value":"=5:495,x1=5000:547428,x2=3:294,y=7:700"`, `"value":"big=9000:985456"`, `"value":"timer e 1700000000400"`, `"value":"timer p 1700000000600"`, `cfg={\"hello\":1} key=z`} {
		if !strings.Contains(ref.out, want) {
			t.Errorf("the Go checker's outputs lack %s:\n%s", want, ref.out)
		}
	}
	if strings.Contains(ref.out, "1700000000450") || strings.Contains(ref.out, "1700000000650") {
		t.Errorf("a deleted timer fired:\n%s", ref.out)
	}
	if ref.dead != "seq 22 (error), seq 23, seq 45 (error), seq 46, seq 68 (error), seq 69" {
		t.Errorf("Go dead letters: %s", ref.dead)
	}
	for name, r := range results {
		if r.out != ref.out {
			t.Errorf("%s: outputs and state differ from the Go SDK's:\n--- go\n%s--- %s\n%s", name, ref.out, name, r.out)
		}
		if r.dead != ref.dead {
			t.Errorf("%s: dead letters %s, the Go SDK's %s", name, r.dead, ref.dead)
		}
	}
	t.Logf("%d languages, the same %d output and state lines, dead letters %s", len(results), strings.Count(ref.out, "\n"), ref.dead)
}
