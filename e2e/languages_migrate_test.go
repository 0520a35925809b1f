package e2e

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn/internal/testutil/langtool"
	"cairn/internal/testutil/testbin"
)

// TestLanguagesStateMigrate is the word count's upgrade of docs/UPGRADES.md
// with the migration written in Rust, C and AssemblyScript
// (operators/examples-*/count_first_seen, the ports of
// examples/upgrade/count_first_seen), each built with its real toolchain:
// a savepoint of 300,000 words' counts over 2 slots (bootstrapped with
// `cairn state import` in builtin:count's state layout) is migrated by each
// module's own migration with `cairn state migrate`; the new job, that
// module, restored from it onto 3 slots with `cairn test --from-savepoint`
// gives exactly a model's outputs over 30,000 records of old and new
// words. Migrating the migrated state again fails with the migration's own
// error, naming the key, and writes nothing. A missing toolchain skips its
// language (.ci/run installs them).
func TestLanguagesStateMigrate(t *testing.T) {
	needLanguageRuns(t)
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	store := "file://" + filepath.Join(dir, "store") + "?create_dir=true"
	writeJob := func(name, module string, slots int) string {
		p := filepath.Join(dir, name+".yaml")
		y := fmt.Sprintf("name: wordcount\ninput: {stream: LINES, subjects: [\"lines.>\"]}\nstages:\n  - {name: count, module: %q, keyed: true}\n"+
			"output: {stream: COUNTS, subject: counts, delivery: exactly_once}\nkey_groups: 128\nslots: %d\ndata_dir: %s\ncheckpoint: {store: %q}\n",
			module, slots, filepath.Join(dir, "data-"+name), store)
		if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cairn := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return string(out), fmt.Errorf("cairn %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return string(out), nil
	}

	// The old job's state: 300,000 words with their counts.
	const words = 300_000
	old := make(map[string]int, words)
	var lines bytes.Buffer
	for i := range words {
		w := fmt.Sprintf("w%06d", i)
		old[w] = i%97 + 1
		fmt.Fprintf(&lines, `{"stage":"count","key":%q,"value":%q}`+"\n", w, base64.StdEncoding.EncodeToString([]byte(fmt.Sprint(old[w]))))
	}
	stateFile := filepath.Join(dir, "state.jsonl")
	if err := os.WriteFile(stateFile, lines.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	v1 := writeJob("v1", "builtin:count", 2)
	if _, err := cairn("state", "import", "--job-file", v1, "--savepoint", "v1", "--slots", "2", "--in", stateFile, "--source-seq", "0"); err != nil {
		t.Fatal(err)
	}

	// The new job's input and the model of its outputs: counts go on,
	// first_seen is the migration's for old words and the first record's
	// time for new ones.
	const firstSeen = 1_600_000_000_000
	var recs bytes.Buffer
	model := make(map[string][2]int64, words)
	for w, n := range old {
		model[w] = [2]int64{int64(n), firstSeen}
	}
	want := map[string][]string{}
	for i := range 30_000 {
		w := fmt.Sprintf("w%06d", (i*7919)%(words+5000)) // some words are new
		tm := int64(1_700_000_000_000 + i)
		fmt.Fprintf(&recs, `{"key":%q,"value":%q,"time":%d}`+"\n", w, w, tm)
		m, ok := model[w]
		if !ok {
			m = [2]int64{0, tm}
		}
		m[0]++
		model[w] = m
		want[w] = append(want[w], fmt.Sprintf("%d,%d", m[0], m[1]))
	}
	input := filepath.Join(dir, "input.jsonl")
	if err := os.WriteFile(input, recs.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	build := map[string][]string{
		"rust": {"sh", "-c", `. ../operators/sdk-rust/rustc.sh && cairn_rustc -o OUT ../operators/examples-rust/count_first_seen/lib.rs`},
		"c": {"clang", "--target=wasm32-wasi", "-mexec-model=reactor", "-O2", "-Wall", "-Wextra", "-I", "../operators/sdk-c", "-o", "OUT",
			"../operators/examples-c/count_first_seen/count_first_seen.c", "../operators/sdk-c/cairn.c", "../operators/sdk-c/cairn_upgrade.c"},
		"as": {"asc", "../operators/examples-as/count_first_seen/count_first_seen.ts", "--outFile", "OUT", "--optimize", "--exportStart", "_initialize",
			"--runtime", "minimal", "--use", "abort=../operators/sdk-as/cairn/cairnAbort"},
	}
	for _, lang := range []struct {
		name  string
		probe func() error
	}{
		{"rust", langtool.Rust},
		{"c", langtool.C},
		{"as", langtool.AS},
	} {
		t.Run(lang.name, func(t *testing.T) {
			if err := lang.probe(); err != nil {
				t.Skipf("the %s toolchain is missing: %v", lang.name, err)
			}
			module := filepath.Join(dir, "count_first_seen_"+lang.name+".wasm")
			args := append([]string(nil), build[lang.name]...)
			for j := range args {
				args[j] = strings.ReplaceAll(args[j], "OUT", module)
			}
			if b, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("build the %s migration: %v\n%s", lang.name, err, b)
			}
			v2 := writeJob("v2-"+lang.name, module, 3)
			sp := "v2-" + lang.name
			t0 := time.Now()
			out, err := cairn("state", "migrate", "--job-file", v2, "--from", "savepoint:v1", "--to", sp, "--stage", "count", "--with", module,
				"--config", fmt.Sprintf(`{"first_seen": %d}`, firstSeen))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, fmt.Sprintf("read %d entries, migrated %d, wrote %d", words, words, words)) || !strings.Contains(out, "stage count at state version 2") {
				t.Fatalf("migrate said %q", out)
			}
			t.Logf("%s: migrated %d entries in %v", lang.name, words, time.Since(t0).Round(time.Millisecond))

			// The new job from the migrated savepoint, on 3 slots.
			out, err = cairn("test", "--job", v2, "--input", input, "--from-savepoint", sp)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][]string{}
			n := 0
			sc := bufio.NewScanner(strings.NewReader(out))
			for sc.Scan() {
				var o struct{ Key, Value string }
				if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
					t.Fatalf("output %q: %v", sc.Text(), err)
				}
				got[o.Key] = append(got[o.Key], o.Value)
				n++
			}
			if n != 30_000 {
				t.Fatalf("%d outputs, want 30000", n)
			}
			for w, vs := range want {
				if fmt.Sprint(got[w]) != fmt.Sprint(vs) {
					t.Fatalf("key %s: outputs %v, model %v", w, got[w], vs)
				}
			}

			// The migrated state through the migration again: its own
			// error, with the key, and no savepoint.
			_, err = cairn("state", "migrate", "--job-file", v2, "--from", "savepoint:"+sp, "--to", sp+"-again", "--stage", "count", "--with", module)
			if err == nil || !strings.Contains(err.Error(), "not a version-0 count") || !strings.Contains(err.Error(), `key "w`) {
				t.Fatalf("migrating migrated state: %v", err)
			}
			if ls, err := cairn("savepoint", "ls", "--job-file", v2); err != nil || strings.Contains(ls, sp+"-again") {
				t.Fatalf("savepoint ls after the failed migration (%v):\n%s", err, ls)
			}
		})
	}
}

// TestLanguagesMigrateSDKCheck runs the migration checkers
// (testdata/migcheck: the same migration in Go, Rust, C and
// AssemblyScript, over every kind of entry: values with and without an
// expiry under several sub-keys, event and processing timers; entries
// changed, dropped and doubled) with `cairn state migrate` over one
// savepoint: every language's savepoint must export exactly the Go one's
// state, which is checked against what the migration does. A migration's
// error and its panic (abort) stop the migration naming the key, in every
// language.
func TestLanguagesMigrateSDKCheck(t *testing.T) {
	needLanguageRuns(t)
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	jobFile := filepath.Join(dir, "job.yaml")
	y := fmt.Sprintf("name: chk\ninput: {stream: IN, subjects: [\"in.>\"]}\nstages:\n  - {name: chk, module: \"builtin:count\", keyed: true}\n"+
		"output: {stream: OUT, subject: out, delivery: exactly_once}\nkey_groups: 16\nslots: 2\ndata_dir: %s\ncheckpoint: {store: %q}\n",
		filepath.Join(dir, "data"), "file://"+filepath.Join(dir, "store")+"?create_dir=true")
	if err := os.WriteFile(jobFile, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	cairn := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return string(out), fmt.Errorf("cairn %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return string(out), nil
	}
	importState := func(name string, lines []string) {
		t.Helper()
		f := filepath.Join(dir, name+".jsonl")
		if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := cairn("state", "import", "--job-file", jobFile, "--savepoint", name, "--in", f, "--source-seq", "0"); err != nil {
			t.Fatal(err)
		}
	}
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	const t0 = 1_700_000_000_000
	var lines []string
	for i := range 300 {
		k := fmt.Sprintf("k%03d", i)
		if i%2 == 0 {
			lines = append(lines, fmt.Sprintf(`{"stage":"chk","key":%q,"value":%q,"expires_ms":%d}`, k, b64(fmt.Sprint("n", i)), t0+int64(i)))
		} else {
			lines = append(lines, fmt.Sprintf(`{"stage":"chk","key":%q,"value":%q}`, k, b64(fmt.Sprint("n", i))))
		}
		lines = append(lines,
			fmt.Sprintf(`{"stage":"chk","key":%q,"sub":"a","value":%q}`, k, b64(strings.Repeat("x", i))),
			fmt.Sprintf(`{"stage":"chk","key":%q,"sub":"drop1","value":%q}`, k, b64("gone")),
			fmt.Sprintf(`{"stage":"chk","kind":"timer","key":%q,"domain":"event","time":%d}`, k, t0+int64(i)))
		if i%3 == 0 {
			lines = append(lines, fmt.Sprintf(`{"stage":"chk","kind":"timer","key":%q,"domain":"processing","time":%d}`, k, t0+int64(2*i)))
		}
	}
	importState("old", lines)
	importState("bad", []string{`{"stage":"chk","key":"good","value":"eA=="}`, `{"stage":"chk","key":"bad","value":"eA=="}`})
	importState("boom", []string{`{"stage":"chk","key":"boom","value":"eA=="}`})

	build := map[string][]string{
		"go":   {"go", "build", "-buildmode=c-shared", "-trimpath", "-o", "OUT", "./testdata/migcheck/go"},
		"rust": {"sh", "-c", `. ../operators/sdk-rust/rustc.sh && cairn_rustc -o OUT testdata/migcheck/rust/lib.rs`},
		"c": {"clang", "--target=wasm32-wasi", "-mexec-model=reactor", "-O2", "-Wall", "-Wextra", "-I", "../operators/sdk-c", "-o", "OUT",
			"testdata/migcheck/c/migcheck.c", "../operators/sdk-c/cairn.c", "../operators/sdk-c/cairn_upgrade.c"},
		"as": {"asc", "testdata/migcheck/as/migcheck.ts", "--outFile", "OUT", "--optimize", "--exportStart", "_initialize",
			"--runtime", "minimal", "--use", "abort=../operators/sdk-as/cairn/cairnAbort"},
	}
	exports := map[string]string{}
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
		module := filepath.Join(dir, "migcheck_"+lang.name+".wasm")
		args := append([]string(nil), build[lang.name]...)
		for j := range args {
			args[j] = strings.ReplaceAll(args[j], "OUT", module)
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build the %s checker: %v\n%s", lang.name, err, b)
		}
		sp := "new-" + lang.name
		out, err := cairn("state", "migrate", "--job-file", jobFile, "--from", "savepoint:old", "--to", sp, "--stage", "chk", "--with", module)
		if err != nil {
			t.Fatalf("%s: %v", lang.name, err)
		}
		if !strings.Contains(out, "stage chk at state version 5") {
			t.Fatalf("%s: migrate said %q", lang.name, out)
		}
		exp, err := cairn("state", "export", "--job-file", jobFile, "--checkpoint", "savepoint:"+sp, "--stage", "chk")
		if err != nil {
			t.Fatal(err)
		}
		_, body, _ := strings.Cut(exp, "\n") // the header names the savepoint
		exports[lang.name] = body
		for _, c := range []struct{ from, want string }{{"bad", `key "bad": bad key`}, {"boom", `key "boom"`}} {
			_, err := cairn("state", "migrate", "--job-file", jobFile, "--from", "savepoint:"+c.from, "--to", c.from+"-"+lang.name, "--stage", "chk", "--with", module)
			if err == nil || !strings.Contains(err.Error(), c.want) || (c.from == "boom" && !strings.Contains(err.Error(), "boom")) {
				t.Errorf("%s: migrating savepoint %s: want an error with %s, got %v", lang.name, c.from, c.want, err)
			} else {
				msg := err.Error()
				t.Logf("%s: %s", lang.name, msg[strings.Index(msg, "\n")+1:])
			}
		}
	}
	ref := exports["go"]
	for _, want := range []string{
		fmt.Sprintf(`"key":"k000","value":%q,"expires_ms":%d}`, b64("v2:n0"), t0+1000),
		fmt.Sprintf(`"key":"k000","sub":".copy","value":%q}`, b64("v2:n0")),
		fmt.Sprintf(`"key":"k001","value":%q}`, b64("v2:n1")),
		fmt.Sprintf(`"key":"k005","sub":"a","value":%q}`, b64("v2:xxxxx")),
		fmt.Sprintf(`"key":"k005","sub":"a.copy","value":%q}`, b64("v2:xxxxx")),
		fmt.Sprintf(`"key":"k007","domain":"event","time":%d}`, t0+17),
		fmt.Sprintf(`"key":"k006","domain":"processing","time":%d}`, t0+22),
	} {
		if !strings.Contains(ref, want) {
			t.Errorf("the Go checker's state lacks %s", want)
		}
	}
	if strings.Contains(ref, "drop1") || strings.Count(ref, "\n") != 300*5+100 {
		t.Errorf("the Go checker's state: %d entries (want 1600), drop1 dropped: %v", strings.Count(ref, "\n"), !strings.Contains(ref, "drop1"))
	}
	for name, got := range exports {
		if got != ref {
			t.Errorf("%s: the migrated state differs from the Go SDK's:\n--- go\n%s--- %s\n%s", name, tail(ref, 3000), name, tail(got, 3000))
		}
	}
}

var benchMigrateEntries = flag.Int("migrate-entries", 300_000, "BenchmarkMigrateLanguages: entries of the savepoint")

// BenchmarkMigrateLanguages measures `cairn state migrate` with the word
// count's migration written in each SDK language (count_first_seen: Go,
// Rust, C, AssemblyScript), side by side over one savepoint, against `cairn
// state scan` of it (the floor of docs/bench/state-migration.md): entries/s
// of each command run as a process, its module's compilation warm (the
// job's compilation cache). A missing toolchain leaves its language out.
//
//	go test ./e2e -run '^$' -bench BenchmarkMigrateLanguages -benchtime 3x
func BenchmarkMigrateLanguages(b *testing.B) {
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	store := "file://" + filepath.Join(dir, "store") + "?create_dir=true"
	jobFile := filepath.Join(dir, "job.yaml")
	y := fmt.Sprintf("name: wordcount\ninput: {stream: LINES, subjects: [\"lines.>\"]}\nstages:\n  - {name: count, module: \"builtin:count\", keyed: true}\n"+
		"output: {stream: COUNTS, subject: counts, delivery: exactly_once}\nkey_groups: 128\nslots: 2\ndata_dir: %s\ncheckpoint: {store: %q}\n", filepath.Join(dir, "data"), store)
	if err := os.WriteFile(jobFile, []byte(y), 0o644); err != nil {
		b.Fatal(err)
	}
	cairn := func(args ...string) {
		b.Helper()
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			b.Fatalf("cairn %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	n := *benchMigrateEntries
	var lines bytes.Buffer
	for i := range n {
		fmt.Fprintf(&lines, `{"stage":"count","key":"w%09d","value":%q}`+"\n", i, base64.StdEncoding.EncodeToString([]byte(fmt.Sprint(i%997+1))))
	}
	in := filepath.Join(dir, "state.jsonl")
	if err := os.WriteFile(in, lines.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
	cairn("state", "import", "--job-file", jobFile, "--savepoint", "v1", "--slots", "2", "--in", in)
	build := map[string][]string{
		"go":   {"go", "build", "-buildmode=c-shared", "-trimpath", "-o", "OUT", "../examples/upgrade/count_first_seen"},
		"rust": {"sh", "-c", `. ../operators/sdk-rust/rustc.sh && cairn_rustc -o OUT ../operators/examples-rust/count_first_seen/lib.rs`},
		"c": {"clang", "--target=wasm32-wasi", "-mexec-model=reactor", "-O2", "-I", "../operators/sdk-c", "-Wl,--strip-all", "-o", "OUT",
			"../operators/examples-c/count_first_seen/count_first_seen.c", "../operators/sdk-c/cairn.c", "../operators/sdk-c/cairn_upgrade.c"},
		"as": {"asc", "../operators/examples-as/count_first_seen/count_first_seen.ts", "--outFile", "OUT", "--optimize", "--exportStart", "_initialize",
			"--runtime", "minimal", "--use", "abort=../operators/sdk-as/cairn/cairnAbort"},
	}
	type bench struct {
		name string
		args func(run int) []string
	}
	benches := []bench{{"scan", func(int) []string {
		return []string{"state", "scan", "--job-file", jobFile, "--checkpoint", "savepoint:v1"}
	}}}
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
			b.Logf("%s left out: %v", lang.name, err)
			continue
		}
		module := filepath.Join(dir, "count_first_seen_"+lang.name+".wasm")
		args := append([]string(nil), build[lang.name]...)
		for j := range args {
			args[j] = strings.ReplaceAll(args[j], "OUT", module)
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("build the %s migration: %v\n%s", lang.name, err, out)
		}
		migrate := func(run int) []string {
			return []string{"state", "migrate", "--job-file", jobFile, "--from", "savepoint:v1", "--to", fmt.Sprintf("%s-%d", lang.name, run),
				"--stage", "count", "--with", module, "--config", `{"first_seen": 1}`}
		}
		cairn(migrate(0)...) // warms the compilation cache
		benches = append(benches, bench{"migrate-" + lang.name, migrate})
	}
	for _, c := range benches {
		b.Run(c.name, func(b *testing.B) {
			var total time.Duration
			run := 0
			for b.Loop() {
				run++
				start := time.Now()
				cmd := exec.Command(bin, c.args(run)...)
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%v\n%s", err, tail(string(out), 2000))
				}
				total += time.Since(start)
			}
			b.ReportMetric(float64(n)/(total.Seconds()/float64(b.N)), "entries/s")
		})
	}
}
