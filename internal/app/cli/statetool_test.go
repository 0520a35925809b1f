package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"cairn/internal/app/devloop"
	"cairn/internal/app/runtime"
)

// TestStateUpgradeWordcount is the word count's upgrade of docs/UPGRADES.md
// end to end, through the commands: a savepoint of 300,000 words' counts
// over 2 slots (bootstrapped with `cairn state import`, in count's own state
// layout, which builtin:count is shown to read on); the new operator
// (examples/upgrade/count_first_seen, state version 2) is refused on it,
// naming both versions and the migrate command; `cairn state migrate` with
// the new module's own migration writes a version-2 savepoint; the new job
// restored from it onto 3 slots produces exactly a model's outputs; the old
// operator is refused on the new state; `cairn state diff` sees every count
// changed.
func TestStateUpgradeWordcount(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	wasmFile := filepath.Join(dir, "count_first_seen.wasm")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", wasmFile, "../../../examples/upgrade/count_first_seen")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	store := "file://" + filepath.Join(dir, "store") + "?create_dir=true"
	writeJob := func(name, module string, slots int) string {
		p := filepath.Join(dir, name)
		y := fmt.Sprintf(`name: wordcount
input: {stream: LINES, subjects: ["lines.>"]}
stages:
  - {name: count, module: %q, keyed: true}
output: {stream: COUNTS, subject: counts, delivery: exactly_once}
key_groups: 128
slots: %d
data_dir: %s
checkpoint: {store: %q}
`, module, slots, filepath.Join(dir, "data-"+name), store)
		if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v1 := writeJob("v1.yaml", "builtin:count", 2)
	v2 := writeJob("v2.yaml", wasmFile, 3)

	// The old job's state: 300,000 words with their counts.
	const words = 300_000
	old := map[string]int{}
	var lines bytes.Buffer
	for i := range words {
		w := fmt.Sprintf("w%06d", i)
		old[w] = i%97 + 1
		fmt.Fprintf(&lines, `{"stage":"count","key":%q,"value":%q}`+"\n", w, b64(fmt.Sprint(old[w])))
	}
	in := filepath.Join(dir, "state.jsonl")
	if err := os.WriteFile(in, lines.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out, errb bytes.Buffer
		err := cmdState(ctx, args, &out, &errb)
		if err != nil {
			t.Logf("cairn state %s: %v\n%s", strings.Join(args, " "), err, errb.String())
		}
		return out.String(), err
	}
	if _, err := run("import", "--job-file", v1, "--savepoint", "v1", "--slots", "2", "--in", in, "--source-seq", "0"); err != nil {
		t.Fatal(err)
	}
	test := func(jobFile, sp string, recs []testRec) ([]testOut, error) {
		f := filepath.Join(dir, "in-"+sp+".jsonl")
		var b bytes.Buffer
		for _, r := range recs {
			l, _ := json.Marshal(r)
			b.Write(append(l, '\n'))
		}
		if err := os.WriteFile(f, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		if err := devloop.TestCommand(ctx, []string{"--job", jobFile, "--input", f, "--from-savepoint", sp}, &out, &errb); err != nil {
			return nil, fmt.Errorf("%w\n%s", err, errb.String())
		}
		var outs []testOut
		sc := bufio.NewScanner(&out)
		for sc.Scan() {
			var o testOut
			if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
				t.Fatalf("output %q: %v", sc.Text(), err)
			}
			outs = append(outs, o)
		}
		return outs, nil
	}
	rec := func(w string, tm int64) testRec { return testRec{Key: w, Value: w, Time: &tm} }

	// builtin:count reads the imported state on: it is count's layout.
	outs, err := test(v1, "v1", []testRec{rec("w000005", 1000), rec("w000200", 1001)})
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]string{}
	for _, o := range outs {
		byKey[o.Key] = o.Value
	}
	if len(outs) != 2 || byKey["w000005"] != fmt.Sprint(old["w000005"]+1) || byKey["w000200"] != fmt.Sprint(old["w000200"]+1) {
		t.Fatalf("builtin:count on the imported state: %+v", outs)
	}

	// The new operator on the old state: refused before anything runs.
	_, err = test(v2, "v1", []testRec{rec("w000005", 1000)})
	if !errors.Is(err, runtime.ErrStateVersion) || !strings.Contains(err.Error(), "declares state version 2, but savepoint v1 holds state version 0") ||
		!strings.Contains(err.Error(), "cairn state migrate --from savepoint:v1 --to v1-v2 --stage count") {
		t.Fatalf("v2 on v1 state: %v", err)
	}
	t.Logf("refused: %v", err)

	// Migrate with the new module's own migration.
	const firstSeen = 1_600_000_000_000
	out, err := run("migrate", "--job-file", v2, "--from", "savepoint:v1", "--to", "v1-v2", "--stage", "count", "--with", wasmFile,
		"--config", fmt.Sprintf(`{"first_seen": %d}`, firstSeen))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, fmt.Sprintf("migrated %d, wrote %d", words, words)) || !strings.Contains(out, "state version 2") {
		t.Fatalf("migrate said %q", out)
	}

	// The savepoint says what it is and where it came from.
	var show bytes.Buffer
	if err := cmdCheckpoints(ctx, []string{"show", "savepoint:v1-v2", "--job-file", v2}, &show, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(show.String(), "count: 2") || !strings.Contains(show.String(), "cairn state migrate from savepoint:v1") ||
		!strings.Contains(show.String(), "migrate stage count with count_first_seen.wasm") {
		t.Fatalf("checkpoints show:\n%s", show.String())
	}

	// The new job from the migrated savepoint, on 3 slots, against the
	// model: count continues, first_seen is the migration's for old words
	// and the first record's time for new ones.
	var recs []testRec
	model := map[string][2]int64{}
	for w, n := range old {
		model[w] = [2]int64{int64(n), firstSeen}
	}
	var want []string
	for i := range 30_000 {
		w := fmt.Sprintf("w%06d", (i*7919)%(words+5000)) // some words are new
		tm := int64(1_700_000_000_000 + i)
		recs = append(recs, rec(w, tm))
		m, ok := model[w]
		if !ok {
			m = [2]int64{0, tm}
		}
		m[0]++
		model[w] = m
		want = append(want, fmt.Sprintf("%s=%d,%d", w, m[0], m[1]))
	}
	outs, err = test(v2, "v1-v2", recs)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, o := range outs {
		got[o.Key] = append(got[o.Key], o.Key+"="+o.Value)
	}
	wantBy := map[string][]string{}
	for _, w := range want {
		k, _, _ := strings.Cut(w, "=")
		wantBy[k] = append(wantBy[k], w)
	}
	if len(outs) != len(want) {
		t.Fatalf("%d outputs, want %d", len(outs), len(want))
	}
	for k, ws := range wantBy {
		if fmt.Sprint(got[k]) != fmt.Sprint(ws) {
			t.Fatalf("key %s: outputs %v, model %v", k, got[k], ws)
		}
	}

	// The old operator on the new state: refused.
	if _, err := test(v1, "v1-v2", []testRec{rec("w000005", 1000)}); !errors.Is(err, runtime.ErrStateVersion) ||
		!strings.Contains(err.Error(), "declares state version 0, but savepoint v1-v2 holds state version 2") {
		t.Fatalf("v1 on v2 state: %v", err)
	}

	// diff: every word's value changed, nothing only on one side.
	out, err = run("diff", "--job-file", v2, "savepoint:v1", "savepoint:v1-v2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, fmt.Sprintf("0          0          %d", words)) {
		t.Fatalf("diff does not show %d changed entries and none only on one side:\n%s", words, out)
	}
	t.Logf("diff:\n%s", out)
}

type testRec struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	Time  *int64 `json:"time,omitempty"`
}

type testOut struct {
	KeyGroup int    `json:"key_group"`
	Index    uint64 `json:"index"`
	Key      string `json:"key"`
	Value    string `json:"value"`
}

func b64(s string) string {
	b, _ := json.Marshal([]byte(s))
	return strings.Trim(string(b), `"`)
}
