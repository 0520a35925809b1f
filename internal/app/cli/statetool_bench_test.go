package cli

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"cairn/checkpoint"
)

var benchStateEntries = flag.Int("state-entries", 500_000, "BenchmarkStateTools: entries of the savepoint")

// BenchmarkStateTools measures `cairn state export` and `cairn state
// migrate` (the word count's migration, count_first_seen) against `cairn
// state scan` of the same savepoint (word count state, 2 slots), each as
// the command runs: entries/s and MiB/s of stored state (keys and values as
// Pebble holds them). scan is the floor: it restores the savepoint into a
// temporary Pebble DB and reads it back.
//
//	go test ./internal/app/cli -run '^$' -bench BenchmarkStateTools -benchtime 3x -state-entries 1000000
func BenchmarkStateTools(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	wasmFile := filepath.Join(dir, "count_first_seen.wasm")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", wasmFile, "../../../examples/upgrade/count_first_seen")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	storeDir := filepath.Join(dir, "store")
	jobFile := filepath.Join(dir, "job.yaml")
	y := fmt.Sprintf(`name: wordcount
input: {stream: LINES, subjects: ["lines.>"]}
stages:
  - {name: count, module: %q, keyed: true}
output: {stream: COUNTS, subject: counts, delivery: exactly_once}
key_groups: 128
slots: 2
data_dir: %s
checkpoint: {store: %q}
`, wasmFile, filepath.Join(dir, "data"), "file://"+storeDir+"?create_dir=true")
	if err := os.WriteFile(jobFile, []byte(y), 0o644); err != nil {
		b.Fatal(err)
	}
	n := *benchStateEntries
	var lines bytes.Buffer
	for i := range n {
		fmt.Fprintf(&lines, `{"stage":"count","key":"w%09d","value":%q}`+"\n", i, b64(fmt.Sprint(i%997+1)))
	}
	in := filepath.Join(dir, "state.jsonl")
	if err := os.WriteFile(in, lines.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := cmdState(ctx, []string{"import", "--job-file", jobFile, "--savepoint", "v1", "--slots", "2", "--in", in}, io.Discard, io.Discard); err != nil {
		b.Fatal(err)
	}
	store, err := checkpoint.OpenStore(ctx, "file://"+storeDir)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close(ctx)
	m, err := checkpoint.LoadSavepoint(ctx, store, "wordcount", "v1")
	if err != nil {
		b.Fatal(err)
	}
	var raw int64
	for slot := range m.Slots {
		x, err := checkpoint.ReadIndex(ctx, store, m, slot)
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range x.Segments {
			raw += s.RawBytes
		}
	}
	// Warm the compilation cache: a migration of a job's state compiles
	// the module once; a benchmark of the state work leaves it out.
	if err := cmdState(ctx, []string{"migrate", "--job-file", jobFile, "--from", "savepoint:v1", "--to", "warm", "--stage", "count", "--with", wasmFile}, io.Discard, io.Discard); err != nil {
		b.Fatal(err)
	}
	runs := 0
	for _, c := range []struct {
		name string
		args func() []string
	}{
		{"scan", func() []string { return []string{"scan", "--job-file", jobFile, "--checkpoint", "savepoint:v1"} }},
		{"export", func() []string { return []string{"export", "--job-file", jobFile, "--checkpoint", "savepoint:v1"} }},
		{"migrate", func() []string {
			runs++
			return []string{"migrate", "--job-file", jobFile, "--from", "savepoint:v1", "--to", fmt.Sprintf("m%d", runs), "--stage", "count", "--with", wasmFile}
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				start := time.Now()
				if err := cmdState(ctx, c.args(), io.Discard, io.Discard); err != nil {
					b.Fatal(err)
				}
				total += time.Since(start)
			}
			sec := total.Seconds() / float64(b.N)
			b.ReportMetric(float64(n)/sec, "entries/s")
			b.ReportMetric(float64(raw)/sec/(1<<20), "MiB/s")
		})
	}
}
