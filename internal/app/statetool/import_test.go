package statetool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"cairn/checkpoint"
	"cairn/internal/base/failpoint"
)

// TestExportImportRoundTrip: a savepoint of every kind of entry (values
// with sub-keys, TTL and binary keys, timers of both domains, engine
// counters and outbox entries) exported and imported again holds the same
// entries byte for byte in the same key groups, on another slot count; it
// restores onto 3 slots with the same state; and its export is the same
// text.
func TestExportImportRoundTrip(t *testing.T) {
	ctx := context.Background()
	store, dir := newStore(t)
	orig := writeSavepoint(t, store, dir, "job", "orig", 64, 2, 5000, mixedState, true)
	want := entriesOf(t, store, orig)
	if len(want) < 5000 {
		t.Fatalf("fixture has %d entries", len(want))
	}
	stages := Stages{"count": 1}
	text := exportString(t, store, orig, stages)
	// The incremental checkpoint of the same state exports the same lines.
	latest, err := checkpoint.Latest(ctx, store, "job")
	if err != nil {
		t.Fatal(err)
	}
	if latest.Mode != checkpoint.ModeIncremental {
		t.Fatalf("latest checkpoint is %s", latest.Mode)
	}
	sameEntries(t, "incremental checkpoint", entriesOf(t, store, latest), want)
	_, body, _ := strings.Cut(text, "\n")
	_, ibody, _ := strings.Cut(exportString(t, store, latest, stages), "\n")
	if body != ibody {
		t.Fatal("the export of the incremental checkpoint differs from the savepoint's")
	}
	m, st, err := Import(ctx, strings.NewReader(text), ImportOptions{Store: store, Job: "job", Name: "copy", File: "orig.jsonl", Slots: 3, Stages: stages, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries != int64(len(want)) {
		t.Fatalf("imported %d entries, want %d", st.Entries, len(want))
	}
	if m.SourceSeq != orig.SourceSeq || m.SourceStream != orig.SourceStream || m.KeyGroups != orig.KeyGroups || len(m.Slots) != 3 ||
		m.Origin == nil || m.Origin.Tool != "import" || m.Modules["count"] != "ab" {
		t.Fatalf("manifest %+v", m)
	}
	loaded, err := checkpoint.LoadSavepoint(ctx, store, "job", "copy")
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, "imported savepoint", entriesOf(t, store, loaded), want)
	sameEntries(t, "imported savepoint restored onto 3 slots", restoredEntries(t, store, loaded, "job", 3), want)
	sameEntries(t, "imported savepoint restored onto 1 slot", restoredEntries(t, store, loaded, "job", 1), want)
	again := exportString(t, store, loaded, stages)
	_, body1, _ := strings.Cut(text, "\n")
	_, body2, _ := strings.Cut(again, "\n")
	if body1 != body2 {
		t.Fatal("the export of the imported savepoint differs from the original's")
	}
	if !strings.Contains(body1, `"stage":"count","kind":"timer"`) || !strings.Contains(body1, `"domain":"processing"`) ||
		!strings.Contains(body1, `"kind":"counter"`) || !strings.Contains(body1, `"key_b64":`) || !strings.Contains(body1, `"expires_ms":`) {
		t.Fatalf("the export lacks a kind of entry:\n%.2000s", body1)
	}

	// With JSON values: the same state back, byte for byte.
	var jb strings.Builder
	if _, err := Export(ctx, &jb, ExportOptions{Store: store, Manifest: orig, Stages: stages, ValueJSON: true}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(jb.String(), `"value_json":`) || !strings.Contains(jb.String(), `"value":"`) {
		t.Fatalf("no mix of JSON and base64 values:\n%.1500s", jb.String())
	}
	jm, _, err := Import(ctx, strings.NewReader(jb.String()), ImportOptions{Store: store, Job: "job", Name: "json", Stages: stages, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, "imported from JSON values", entriesOf(t, store, jm), want)

	// A hand-written bootstrap without a header: key groups computed from
	// the keys, and it restores.
	boot := `{"stage":"count","key":"apple","value":"Mw=="}
{"stage":"count","key":"pear","value":"MQ==","expires_ms":1800000000000}
{"stage":"count","kind":"timer","key":"apple","time":99}
{"stage":"count","key":"plum","value_json":{"n": 2, "first": [1, 2]}}
`
	if _, _, err := Import(ctx, strings.NewReader(boot), ImportOptions{Store: store, Job: "job", Name: "boot", KeyGroups: 64, Stages: stages, SourceSeq: 7, SetSourceSeq: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	bm, err := checkpoint.LoadSavepoint(ctx, store, "job", "boot")
	if err != nil {
		t.Fatal(err)
	}
	if got := restoredEntries(t, store, bm, "job", 2); len(got) != 4 || bm.SourceSeq != 7 || !strings.Contains(fmt.Sprint(got), `{"n": 2, "first": [1, 2]}`) {
		t.Fatalf("bootstrap restored %d entries, source_seq %d", len(got), bm.SourceSeq)
	}
}

// TestImportRefusesBadInput: each bad line is refused with its line
// number and the kind of fault, and nothing is written to the store.
func TestImportRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	store, dir := newStore(t)
	good := `{"stage":"count","key":"a","value":"MQ=="}` + "\n"
	long := strings.Repeat("k", 100)
	for _, c := range []struct {
		name, in string
		line     int
		want     error
	}{
		{"not json", good + "{\"stage\":\"count\",\n", 2, ErrBadLine},
		{"unknown field", good + good[:len(good)-2] + `,"colour":"red"}` + "\n", 2, ErrBadLine},
		{"bad base64", good + `{"stage":"count","key":"b","value":"!!"}` + "\n", 2, ErrBadLine},
		{"unknown stage", good + good + `{"stage":"cnt","key":"b","value":"MQ=="}` + "\n", 3, ErrUnknownStage},
		{"key too long", good + `{"stage":"count","key":"` + long + `","value":"MQ=="}` + "\n", 2, ErrKeyTooLong},
		{"wrong key group", `{"stage":"count","kg":-1,"key":"a","value":"MQ=="}` + "\n", 1, ErrWrongKeyGroup},
		{"duplicate", good + "\n" + `{"stage":"count","key":"z","value":"MQ=="}` + "\n" + good, 4, ErrDuplicate},
		{"counter of a stage", `{"stage":"count","kind":"counter","kg":1,"counter":1,"value":"AA=="}` + "\n", 1, ErrBadLine},
		{"system without kg", `{"stage":"_system","key":"outbox","value":"AA=="}` + "\n", 1, ErrBadLine},
		{"timer without time", `{"stage":"count","kind":"timer","key":"a"}` + "\n", 1, ErrBadLine},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Import(ctx, strings.NewReader(c.in), ImportOptions{Store: store, Job: "job", Name: "bad", File: "in.jsonl", KeyGroups: 16,
				Stages: Stages{"count": 1}, MaxKeyBytes: 64, Logger: quiet})
			var le *LineError
			if !errors.As(err, &le) || le.Line != c.line || !errors.Is(err, c.want) || !strings.Contains(err.Error(), fmt.Sprintf("in.jsonl:%d:", c.line)) {
				t.Fatalf("got %v, want line %d and %v", err, c.line, c.want)
			}
			t.Logf("%v", err)
		})
	}
	if names, err := checkpoint.ListSavepoints(ctx, store, "job"); err != nil || len(names) != 0 {
		t.Fatalf("savepoints %v, %v", names, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "store", "job", "savepoints", "*")); len(left) != 0 {
		t.Fatalf("a refused import left %v", left)
	}
}

// childEnv names the test process that a crash test runs as a child.
const childEnv = "STATETOOL_TEST_CHILD"

// TestImportKilledBeforeCommit: an import killed (SIGKILL, failpoint
// savepoint-build-before-manifest) after writing its data leaves no
// savepoint; a rerun succeeds and removes the leftovers.
func TestImportKilledBeforeCommit(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		return
	}
	ctx := context.Background()
	store, dir := newStore(t)
	orig := writeSavepoint(t, store, dir, "job", "orig", 32, 2, 3000, mixedState, false)
	text := exportString(t, store, orig, nil)
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestImportChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+dir, failpoint.EnvVar+"="+failpoint.SavepointBuildBeforeManifest)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL || !strings.Contains(string(out), "failpoint "+failpoint.SavepointBuildBeforeManifest) {
		t.Fatalf("child not killed at the failpoint: %v\n%s", err, out)
	}
	if data, _ := filepath.Glob(filepath.Join(dir, "store", "job", "savepoints", "copy", "slot-*", "*")); len(data) == 0 {
		t.Fatal("the child wrote no data before the failpoint: the test proves nothing")
	}
	if _, err := checkpoint.LoadSavepoint(ctx, store, "job", "copy"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("a killed import left a savepoint: %v", err)
	}
	if names, _ := checkpoint.ListSavepoints(ctx, store, "job"); len(names) != 1 {
		t.Fatalf("savepoints %v", names)
	}
	f, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, _, err := Import(ctx, f, ImportOptions{Store: store, Job: "job", Name: "copy", Slots: 3, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.LoadSavepoint(ctx, store, "job", "copy")
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, "rerun", entriesOf(t, store, m), entriesOf(t, store, orig))
	objs := 0
	if err := store.List(ctx, "job/savepoints/copy/", func(checkpoint.ObjectInfo) error { objs++; return nil }); err != nil {
		t.Fatal(err)
	}
	if objs != len(m.Objects)+1 {
		t.Fatalf("%d objects under the savepoint, its manifest lists %d (+ itself)", objs, len(m.Objects))
	}
}

// TestImportChild is the child of TestImportKilledBeforeCommit.
func TestImportChild(t *testing.T) {
	dir := os.Getenv(childEnv)
	if dir == "" {
		t.Skip("run by TestImportKilledBeforeCommit")
	}
	store, err := checkpoint.OpenStore(context.Background(), "file://"+filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "in.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = Import(context.Background(), f, ImportOptions{Store: store, Job: "job", Name: "copy", Slots: 2, Logger: quiet})
	t.Fatalf("the import was not killed: %v", err)
}
