package runtime

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/base/natsembed"
)

// The refusals Start makes before NATS starts or anything is restored, on
// real files: each names the path and the cause.

const testJob = `
name: refusals
input:  {stream: LINES, subjects: ["lines.>"]}
stages:
  - {name: count, module: "native:count", keyed: true}
output: {stream: COUNTS, subject: counts}
`

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// parseJob parses testJob plus extra lines with the data directory set.
func parseJob(t *testing.T, dataDir, extra string) *job.Job {
	t.Helper()
	j, err := job.Parse([]byte(testJob + extra))
	if err != nil {
		t.Fatal(err)
	}
	j.DataDir = dataDir
	return j
}

// underFile is a path whose parent is a regular file: it can be neither
// created nor written, even by root (the tests may run as root).
func underFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(f, "data")
}

// startWithin runs Start and fails the test if it does not return in d.
func startWithin(t *testing.T, d time.Duration, j *job.Job) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		r, err := Start(context.Background(), j, Options{Restore: "none"}, quietLog())
		if err == nil {
			r.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("Start did not return within %s", d)
		return nil
	}
}

func TestCheckDataDir(t *testing.T) {
	t.Run("created", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "a", "b")
		if err := CheckDataDir(dir); err != nil {
			t.Fatal(err)
		}
		ents, err := os.ReadDir(dir)
		if err != nil || len(ents) != 0 {
			t.Fatalf("data dir after the check: %v %v, want it to exist and be empty", ents, err)
		}
	})
	t.Run("parent is a file", func(t *testing.T) {
		dir := underFile(t)
		err := CheckDataDir(dir)
		if !errors.Is(err, syscall.ENOTDIR) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "--data") {
			t.Fatalf("got %v, want ENOTDIR naming %s and the --data flag", err, dir)
		}
	})
	t.Run("is a file", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(dir, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := CheckDataDir(dir); !errors.Is(err, syscall.ENOTDIR) || !strings.Contains(err.Error(), dir) {
			t.Fatalf("got %v, want ENOTDIR naming %s", err, dir)
		}
	})
	t.Run("read-only", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root writes into a read-only directory; the cases above fail for root too")
		}
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(dir, 0o755)
		if err := CheckDataDir(dir); !errors.Is(err, os.ErrPermission) || !strings.Contains(err.Error(), "not writable") {
			t.Fatalf("got %v, want a permission error saying not writable", err)
		}
	})
}

// TestStartRefusesDataDirFirst: with the embedded server, a data directory
// that cannot be created fails at once with its path and cause, not after
// the server waited 10 s; with an external server, before dialing it.
func TestStartRefusesDataDirFirst(t *testing.T) {
	for _, nats := range []string{"embedded", "nats://127.0.0.1:1"} {
		dir := underFile(t)
		j := parseJob(t, dir, "nats: "+nats+"\n")
		start := time.Now()
		err := startWithin(t, 5*time.Second, j)
		if !errors.Is(err, syscall.ENOTDIR) || !strings.Contains(err.Error(), "data directory "+dir) {
			t.Errorf("nats %s: got %v, want the data directory refused with ENOTDIR", nats, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("nats %s: refused after %s", nats, d)
		}
	}
}

func TestReadModule(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "op.wasm")
	if err := os.WriteFile(good, []byte("\x00asm\x01\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadModule(good, 1024); err != nil || len(b) != 8 {
		t.Fatalf("regular file: %d bytes, %v", len(b), err)
	}
	fifo := filepath.Join(dir, "fifo.wasm")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.wasm")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 1025); err != nil { // sparse: the check must not read it
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{fifo, "is a named pipe (FIFO), not a regular file"},
		{"/dev/zero", "is a character device, not a regular file"},
		{dir, "is a directory, not a regular file"},
		{big, "is 1025 bytes, larger than the limit of 1024"},
		{filepath.Join(dir, "missing.wasm"), "no such file or directory"},
	} {
		done := make(chan error, 1)
		go func() { _, err := ReadModule(tc.path, 1024); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: got %v, want the path and %q", tc.path, err, tc.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: readModule hangs", tc.path)
		}
	}
}

// TestStartRefusesModuleFirst: a FIFO as a module fails the start at once,
// naming the field, before the embedded server is started (it would create
// its store under the data directory).
func TestStartRefusesModuleFirst(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "op.wasm")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	j := parseJob(t, data, "")
	j.Stages[0].Module = fifo
	err := startWithin(t, 5*time.Second, j)
	var je *job.Error
	if !errors.As(err, &je) || je.Field != "stages[0].module" || !strings.Contains(err.Error(), fifo+" is a named pipe") {
		t.Fatalf("got %v, want stages[0].module refused as a FIFO", err)
	}
	if _, err := os.Stat(filepath.Join(data, "nats")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the embedded server's store exists (%v): NATS started before the module was checked", err)
	}
}

// TestEmbeddedNATSStartError: the embedded server's own start error (its
// JetStream store cannot be created) is returned at once, not after 10 s.
func TestEmbeddedNATSStartError(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nats"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	srv, err := natsembed.Start(natsembed.Options{Dir: dir})
	if err == nil {
		srv.Shutdown()
		t.Fatal("started with a file where the JetStream store goes")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("refused after %s", d)
	}
	if msg := err.Error(); strings.Contains(msg, "not ready") || !strings.Contains(msg, filepath.Join(dir, "nats")) || !strings.Contains(msg, "JetStream") {
		t.Errorf("got %q, want the server's own JetStream error naming the store", msg)
	}
}

// TestEngineConfig: the new job fields reach the engine, and the job
// package's defaults are the engine's.
func TestEngineConfig(t *testing.T) {
	if job.DefaultMaxKeyBytes != engine.DefaultMaxKeyBytes || job.DefaultMaxFutureSkew != engine.DefaultMaxFutureSkew {
		t.Fatalf("job defaults %d, %v differ from the engine's %d, %v",
			job.DefaultMaxKeyBytes, job.DefaultMaxFutureSkew, engine.DefaultMaxKeyBytes, engine.DefaultMaxFutureSkew)
	}
	for _, tc := range []struct {
		extra    string
		keyBytes int
		skew     time.Duration
	}{
		{"", engine.DefaultMaxKeyBytes, engine.DefaultMaxFutureSkew},
		{"max_key_bytes: 100\nwatermark: {max_future_skew: 30s}\n", 100, 30 * time.Second},
		{"watermark: {max_future_skew: off}\n", engine.DefaultMaxKeyBytes, -1},
	} {
		j := parseJob(t, t.TempDir(), tc.extra)
		cfg := engineConfig(j, nil, quietLog())
		if cfg.MaxKeyBytes != tc.keyBytes || cfg.MaxFutureSkew != tc.skew {
			t.Errorf("%q: MaxKeyBytes %d, MaxFutureSkew %v; want %d, %v", tc.extra, cfg.MaxKeyBytes, cfg.MaxFutureSkew, tc.keyBytes, tc.skew)
		}
	}
	for clock, wall := range map[string]bool{"": false, "clock: ingestion, ": false, "clock: wall, ": true} {
		src := strings.Replace(testJob, "{name: count, ", "{name: count, "+clock, 1) + "output: {subject: counts, delivery: core}\n"
		src = strings.Replace(src, "output: {stream: COUNTS, subject: counts}\n", "", 1)
		j, err := job.Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		stages, _, err := buildStages(context.Background(), nil, j, memoryBudget{}, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		if stages[0].WallClock != wall {
			t.Errorf("%q: WallClock %v, want %v", clock, stages[0].WallClock, wall)
		}
	}
}

// TestFileStoreCreatedOnFirstStart: a missing file:// store directory is
// created when the job has never checkpointed, and refused, naming both
// folders, when the data directory holds its checkpoints.
func TestFileStoreCreatedOnFirstStart(t *testing.T) {
	data := t.TempDir()
	storeDir := filepath.Join(t.TempDir(), "store")
	j := &job.Job{Name: "j", DataDir: data}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := ensureFileStoreDir("file://"+storeDir, j, log); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(storeDir); err != nil || !fi.IsDir() {
		t.Fatalf("store directory not created: %v", err)
	}
	os.RemoveAll(storeDir)
	if err := os.MkdirAll(filepath.Join(data, "checkpoints", "chk-00000000000000000007"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := ensureFileStoreDir("file://"+storeDir, j, log)
	if err == nil || !strings.Contains(err.Error(), storeDir) || !strings.Contains(err.Error(), "holds checkpoints") {
		t.Fatalf("a vanished store was not refused: %v", err)
	}
	if _, err := os.Stat(storeDir); err == nil {
		t.Fatal("the store directory was created anyway")
	}
}

// TestDefaultStoreInTheDataDir: a job without checkpoint.store keeps its
// checkpoints in <data>/store, also when the data directory's name holds
// characters a URL gives a meaning ('#', '?', '%', a space), and the
// first-start check creates exactly that directory for an escaped URL.
func TestDefaultStoreInTheDataDir(t *testing.T) {
	data := filepath.Join(t.TempDir(), "job #2?", "100% data")
	j := &job.Job{Name: "j", DataDir: data, Checkpoint: &job.Checkpoint{}}
	u, err := StoreURL(j)
	if err != nil {
		t.Fatal(err)
	}
	s, err := checkpoint.OpenStore(context.Background(), u)
	if err != nil {
		t.Fatalf("OpenStore(%q): %v", u, err)
	}
	defer s.Close(context.Background())
	if err := s.Put(context.Background(), "x", strings.NewReader("here")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(data, "store", "x")); err != nil || string(b) != "here" {
		t.Fatalf("store URL %q: the object is not in %s: %v", u, filepath.Join(data, "store"), err)
	}

	storeDir := filepath.Join(t.TempDir(), "my store#1")
	u, err = checkpoint.FileStoreURL(storeDir, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := ensureFileStoreDir(u, &job.Job{Name: "j", DataDir: t.TempDir()}, quietLog()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(storeDir); err != nil || !fi.IsDir() {
		t.Fatalf("%q: store directory %s not created: %v", u, storeDir, err)
	}
}

// TestModuleChangeRefused: a stage whose module file changed since the
// checkpoint is refused, naming both hashes and the upgrade path; builtins
// and unchanged modules are not.
func TestModuleChangeRefused(t *testing.T) {
	j := &job.Job{Stages: []job.Stage{{Name: "split", Module: "builtin:split"}, {Name: "op", Module: "op.wasm", Keyed: true}}}
	m := &checkpoint.Manifest{ID: 7, Modules: map[string]string{"split": "aaaa", "op": "1111111111111111"}}
	if err := moduleChanged(j, m, map[string]string{"split": "bbbb", "op": "1111111111111111"}); err != nil {
		t.Fatalf("a builtin's change or an unchanged module refused: %v", err)
	}
	err := moduleChanged(j, m, map[string]string{"split": "aaaa", "op": "2222222222222222"})
	if !errors.Is(err, ErrModuleChanged) || !strings.Contains(err.Error(), "savepoint") || !strings.Contains(err.Error(), "stage op") {
		t.Fatalf("a changed module: %v", err)
	}
}
