package statetool

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"

	"cairn/checkpoint"
	"cairn/internal/base/failpoint"
	"cairn/state"
	"cairn/wasm"
)

var (
	modMu  sync.Mutex
	modDir string
	mods   = map[string][]byte{}
	// testRT compiles the migration modules once for every test's
	// migrations (the CLI uses the job's compilation cache the same way).
	testRT *wasm.Runtime
)

// runtimeForTests is testRT, made on first use.
func runtimeForTests(t testing.TB) *wasm.Runtime {
	t.Helper()
	modMu.Lock()
	defer modMu.Unlock()
	if testRT == nil {
		rt, err := wasm.NewRuntime(context.Background(), wasm.RuntimeConfig{})
		if err != nil {
			t.Fatal(err)
		}
		testRT = rt
	}
	return testRT
}

func TestMain(m *testing.M) {
	code := m.Run()
	if testRT != nil {
		testRT.Close(context.Background())
	}
	if modDir != "" {
		os.RemoveAll(modDir)
	}
	os.Exit(code)
}

// buildModule builds the Go wasm module in dir (relative to this package)
// once per test process, with the Go toolchain as an operator author does.
func buildModule(t testing.TB, dir string) []byte {
	t.Helper()
	modMu.Lock()
	defer modMu.Unlock()
	if b, ok := mods[dir]; ok {
		return b
	}
	if modDir == "" {
		d, err := os.MkdirTemp("", "statetool-wasm-")
		if err != nil {
			t.Fatal(err)
		}
		modDir = d
	}
	out := filepath.Join(modDir, filepath.Base(dir)+".wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, "./"+dir)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", dir, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	mods[dir] = b
	return b
}

// testmigModel is what testdata/testmig makes of the stored entries (see
// its doc comment), computed here from the decoded entries.
func testmigModel(t *testing.T, in []kv, firstSeen, extend string) []kv {
	var out []kv
	for _, x := range in {
		e, err := decodeEntry([]byte(x.k), []byte(x.v))
		if err != nil {
			t.Fatal(err)
		}
		if e.Stage == 1 {
			switch {
			case e.Kind == state.KindTimer && e.Domain == state.DomainEventTime:
				e.Time++
			case e.Kind == state.KindValue && len(e.Sub) > 0:
				continue
			case e.Kind == state.KindValue:
				e.Value = []byte(string(e.Value) + "," + firstSeen)
				if e.HasExpiry {
					e.ExpiryMs += 1000
				}
			}
		}
		k, v := e.encode()
		out = append(out, kv{string(k), string(v)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].k < out[j].k })
	return out
}

// TestMigrate: a stage's values (with their TTL) and timers run through a
// Go migration module, key group by key group; the engine's state passes
// unchanged; the savepoint records its origin and the new state version,
// and restores onto 3 slots with exactly the model's entries. A failing,
// panicking or re-keying migration is refused naming the key, and writes
// no savepoint.
func TestMigrate(t *testing.T) {
	ctx := context.Background()
	store, dir := newStore(t)
	mod := buildModule(t, "testdata/testmig")
	orig := writeSavepoint(t, store, dir, "job", "v1", 64, 2, 4000, mixedState, true)
	before := entriesOf(t, store, orig)
	stages := Stages{"count": 1}
	opts := MigrateOptions{Store: store, From: orig, FromSpec: "savepoint:v1", Job: "job", To: "v3", Stages: stages, Stage: "count",
		Module: mod, ModuleName: "testmig.wasm", Config: []byte(`{"first_seen": 777, "extend_ms": 1000}`), Logger: quiet, BatchEntries: 100,
		Runtime: runtimeForTests(t)}
	m, st, err := Migrate(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	want := testmigModel(t, before, "777", "1000")
	sameEntries(t, "migrated savepoint", entriesOf(t, store, m), want)
	loaded, err := checkpoint.LoadSavepoint(ctx, store, "job", "v3")
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, "migrated savepoint restored onto 3 slots", restoredEntries(t, store, loaded, "job", 3), want)
	if loaded.StateVersions["count"] != 3 || st.StateVersion != 3 || loaded.FormatVersion != checkpoint.FormatVersion2 ||
		loaded.Origin == nil || loaded.Origin.Tool != "migrate" || loaded.Origin.From != "savepoint:v1" || loaded.Origin.FromID != 42 ||
		loaded.SourceSeq != orig.SourceSeq || len(loaded.Slots) != 2 {
		t.Fatalf("manifest: %+v origin %+v", loaded, loaded.Origin)
	}
	if st.Read.Entries != int64(len(before)) || st.Written.Entries != int64(len(want)) || st.Migrated == 0 {
		t.Fatalf("stats %+v (read %d, wrote %d)", st, len(before), len(want))
	}

	// Failures name the key and leave no savepoint.
	for _, c := range []struct{ name, config, want string }{
		{"error", `{"fail": "word-0000042"}`, `key "word-0000042": refusing this key`},
		{"panic", `{"panic": "word-0000042"}`, `a bug in the migration`},
		{"rekey", `{"rekey": "word-0000042"}`, `wrote key "word-0000042-moved", which is in key group`},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := opts
			o.To, o.Config = "bad", []byte(c.config)
			_, _, err := Migrate(ctx, o)
			if !errors.Is(err, ErrMigration) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
			t.Log(err)
			if _, err := checkpoint.LoadSavepoint(ctx, store, "job", "bad"); !errors.Is(err, checkpoint.ErrNotFound) {
				t.Fatalf("a failed migration left a savepoint: %v", err)
			}
		})
	}

	// Rename, then drop: metadata follows the name, the state goes.
	r, _, err := Migrate(ctx, MigrateOptions{Store: store, From: loaded, FromSpec: "savepoint:v3", Job: "job", To: "renamed", Stages: stages,
		Rename: map[string]string{"count": "tally"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if r.StateVersions["tally"] != 3 || r.StateVersions["count"] != 0 || r.Modules["tally"] != "ab" || r.Modules["count"] != "" {
		t.Fatalf("renamed: versions %v modules %v", r.StateVersions, r.Modules)
	}
	sameEntries(t, "renamed", entriesOf(t, store, r), want)
	d, _, err := Migrate(ctx, MigrateOptions{Store: store, From: r, FromSpec: "savepoint:renamed", Job: "job", To: "dropped", Stages: Stages{"tally": 1},
		Drop: []string{"tally"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var system []kv
	for _, x := range want {
		if x.k[2] == state.SystemStage {
			system = append(system, x)
		}
	}
	if len(system) == 0 {
		t.Fatal("fixture without engine state")
	}
	sameEntries(t, "dropped", entriesOf(t, store, d), system)
	if len(d.StateVersions) != 0 || d.Modules["tally"] != "" {
		t.Fatalf("dropped: versions %v modules %v", d.StateVersions, d.Modules)
	}
	if _, _, err := Migrate(ctx, MigrateOptions{Store: store, From: r, Job: "job", To: "x", Stages: stages, Drop: []string{"nope"}, Logger: quiet}); !errors.Is(err, ErrUnknownStage) {
		t.Fatalf("drop of an unknown stage: %v", err)
	}
}

// TestMigrateKilledBeforeCommit: a migration killed (SIGKILL, failpoint
// savepoint-build-before-manifest) after writing its data leaves no
// savepoint; a rerun succeeds with the model's state.
func TestMigrateKilledBeforeCommit(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		return
	}
	ctx := context.Background()
	store, dir := newStore(t)
	mod := buildModule(t, "testdata/testmig")
	if err := os.WriteFile(filepath.Join(dir, "testmig.wasm"), mod, 0o644); err != nil {
		t.Fatal(err)
	}
	orig := writeSavepoint(t, store, dir, "job", "v1", 32, 2, 3000, mixedState, true)
	cmd := exec.Command(os.Args[0], "-test.run=^TestMigrateChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+dir, failpoint.EnvVar+"="+failpoint.SavepointBuildBeforeManifest)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL || !strings.Contains(string(out), "failpoint "+failpoint.SavepointBuildBeforeManifest) {
		t.Fatalf("child not killed at the failpoint: %v\n%s", err, out)
	}
	if data, _ := filepath.Glob(filepath.Join(dir, "store", "job", "savepoints", "v3", "slot-*", "*")); len(data) == 0 {
		t.Fatal("the child wrote no data before the failpoint: the test proves nothing")
	}
	if _, err := checkpoint.LoadSavepoint(ctx, store, "job", "v3"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("a killed migration left a savepoint: %v", err)
	}
	o := migrateChildOptions(store, orig, mod)
	o.Runtime = runtimeForTests(t)
	m, _, err := Migrate(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, "rerun", entriesOf(t, store, m), testmigModel(t, entriesOf(t, store, orig), "777", "1000"))
}

func migrateChildOptions(store checkpoint.Store, from *checkpoint.Manifest, mod []byte) MigrateOptions {
	return MigrateOptions{Store: store, From: from, FromSpec: "savepoint:v1", Job: "job", To: "v3", Stages: Stages{"count": 1}, Stage: "count",
		Module: mod, ModuleName: "testmig.wasm", Config: []byte(`{"first_seen": 777, "extend_ms": 1000}`), Logger: quiet}
}

// TestMigrateChild is the child of TestMigrateKilledBeforeCommit.
func TestMigrateChild(t *testing.T) {
	dir := os.Getenv(childEnv)
	if dir == "" {
		t.Skip("run by TestMigrateKilledBeforeCommit")
	}
	ctx := context.Background()
	store, err := checkpoint.OpenStore(ctx, "file://"+filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(dir, "testmig.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	from, err := checkpoint.LoadSavepoint(ctx, store, "job", "v1")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = Migrate(ctx, migrateChildOptions(store, from, mod))
	t.Fatalf("the migration was not killed: %v", err)
}
