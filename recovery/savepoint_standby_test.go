package recovery

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/recovery/model"
)

func TestRestoreSavepoint(t *testing.T) {
	e := newEnv(t, nil, 32, 2, checkpoint.ModeIncremental, 8)
	e.write(6000, 10000, 50, 0)
	e.checkpoint("")
	snaps, want := e.snapshot(99)
	if _, err := e.w.Savepoint(e.ctx, 99, "sp1", checkpoint.Meta{SourceStream: "in", SourceSeq: 1234}, snaps); err != nil {
		t.Fatal(err)
	}
	e.write(2000, 10000, 50, 100) // later changes are not in the savepoint
	e.checkpoint("")

	m, err := Select(e.ctx, e.store, testJob, "savepoint:sp1")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []int{2, 3, 1} {
		data := t.TempDir()
		o := e.opts(data, q)
		o.LocalDir = e.localDir // a local chk-00..99 exists but must not be used
		r, err := Restore(e.ctx, m, o)
		if err != nil {
			t.Fatal(err)
		}
		if r.Savepoint != "sp1" || r.SourceSeq != 1234 || r.BytesLocal != 0 || r.Mode != checkpoint.ModeFull {
			t.Fatalf("result %+v", r)
		}
		checkRestored(t, data, 32, q, want)
	}

	// Relocated: copied to another store under another job and name.
	other, err := checkpoint.NewFileStore(filepath.Join(t.TempDir(), "other"), true)
	if err != nil {
		t.Fatal(err)
	}
	from, to := checkpoint.SavepointDir(testJob, "sp1")+"/", checkpoint.SavepointDir("job2", "moved")+"/"
	err = e.store.List(e.ctx, from, func(oi checkpoint.ObjectInfo) error {
		rc, err := e.store.Get(e.ctx, oi.Name)
		if err != nil {
			return err
		}
		defer rc.Close()
		return other.Put(e.ctx, to+strings.TrimPrefix(oi.Name, from), rc)
	})
	if err != nil {
		t.Fatal(err)
	}
	m2, err := Select(e.ctx, other, "job2", "savepoint:moved")
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	o := e.opts(data, 4)
	o.Store, o.Job = other, "job2"
	if _, err := Restore(e.ctx, m2, o); err != nil {
		t.Fatal(err)
	}
	checkRestored(t, data, 32, 4, want)
	o.Job = testJob
	if _, err := Restore(e.ctx, m2, o); !errors.Is(err, ErrWrongJob) {
		t.Fatalf("savepoint of job2 restored as %s: %v", testJob, err)
	}
}

func TestStandby(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t, nil, 32, 2, mode, 9)
			cache := filepath.Join(t.TempDir(), "cache")
			sb := NewStandby(e.store, testJob, cache, quietLogger())
			var synced []model.Transfer
			sb.OnSync = func(tr model.Transfer) { synced = append(synced, tr) }
			e.write(15000, 20000, 80, 0)
			for range 3 {
				e.write(2000, 20000, 80, 200)
				e.checkpoint("")
				if err := sb.Sync(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// Each round that fetched files told the model what it fetched.
			var cachedBytes int64
			cachedFiles := map[string]bool{}
			for _, mm := range []*checkpoint.Manifest{e.w.Latest()} {
				for _, o := range mm.Objects {
					if !cachedFiles[o.Path] {
						cachedBytes += o.Size
					}
					cachedFiles[o.Path] = true
				}
			}
			var syncedBytes int64
			for _, tr := range synced {
				if tr.From != "standby" || tr.Objects == 0 || tr.Seconds <= 0 {
					t.Fatalf("sync transfer %+v", tr)
				}
				syncedBytes += tr.Bytes
			}
			if len(synced) == 0 || syncedBytes < cachedBytes {
				t.Fatalf("%d sync transfers of %d bytes; the newest checkpoint alone is %d", len(synced), syncedBytes, cachedBytes)
			}
			prev := e.w.Latest()
			if lag := sb.Lag(); lag.LastSynced != prev.ID || lag.CheckpointsBehind != 0 || lag.BytesBehind != 0 || lag.Err != nil {
				t.Fatalf("lag after sync: %+v", lag)
			}
			// The primary takes one more checkpoint and dies before the
			// standby syncs it.
			e.write(2000, 20000, 80, 200)
			m, want := e.checkpoint("")
			cached := map[string]bool{}
			for _, mm := range []*checkpoint.Manifest{prev} {
				for _, o := range mm.Objects {
					cached[o.Path] = true
				}
			}
			var newBytes int64
			seen := map[string]bool{}
			for _, o := range m.Objects {
				if !cached[o.Path] && !seen[o.Path] {
					newBytes += o.Size
				}
				seen[o.Path] = true
			}
			// A sync that only computes the lag: the standby reports the
			// new checkpoint as behind (a full sync would fetch it).
			sb.mu.Lock()
			ids := []uint64{m.ID}
			for id := range sb.mu.manifests {
				ids = append(ids, id)
			}
			sb.mu.manifests[m.ID] = m
			sortDesc(ids)
			sb.updateLagLocked(ids)
			lag := sb.Lag()
			delete(sb.mu.manifests, m.ID)
			sb.mu.Unlock()
			if lag.CheckpointsBehind != 1 || lag.Latest != m.ID || lag.LastSynced != prev.ID || lag.BytesBehind != newBytes {
				t.Fatalf("lag before sync: %+v, want 1 behind, %d bytes", lag, newBytes)
			}

			data := t.TempDir()
			o := e.opts(data, 0)
			o.CacheDir = cache
			r, err := Restore(ctx, m, o)
			if err != nil {
				t.Fatal(err)
			}
			checkRestored(t, data, 32, 2, want)
			if mode == checkpoint.ModeIncremental {
				if r.BytesDownloaded != newBytes || r.BytesCache != m.Figures.FullStateSize-newBytes {
					t.Fatalf("restore from the cache downloaded %d (cache %d), want only the new %d", r.BytesDownloaded, r.BytesCache, newBytes)
				}
			} else if r.BytesCache != 0 || r.BytesDownloaded == 0 {
				// A full checkpoint shares nothing with the previous one.
				t.Fatalf("full restore: %+v", r)
			}

			// Once synced, a restore downloads nothing; retention's drops
			// are pruned from the cache.
			if err := sb.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			data2 := t.TempDir()
			o.DataDir = data2
			if r, err = Restore(ctx, m, o); err != nil || r.BytesDownloaded != 0 {
				t.Fatalf("after sync: %+v %v", r, err)
			}
			checkRestored(t, data2, 32, 2, want)
		})
	}
}

func TestStandbyPrunesAndRuns(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newEnv(t, nil, 16, 1, checkpoint.ModeIncremental, 10)
	cache := t.TempDir()
	sb := NewStandby(e.store, testJob, cache, quietLogger())
	done := make(chan error, 1)
	go func() { done <- sb.Run(ctx, 10*time.Millisecond) }()
	var last *checkpoint.Manifest
	for range 4 {
		e.write(3000, 5000, 40, 100)
		last, _ = e.checkpoint(checkpoint.ModeFull)
	}
	// Keep only the last checkpoint in the store.
	if _, err := checkpoint.GC(ctx, e.store, testJob, 1, time.Hour, false); err != nil {
		t.Fatal(err)
	}
	keep := strings.TrimPrefix(checkpoint.CheckpointDir(testJob, last.ID), testJob+"/")
	// Only the retained checkpoint's files remain, once a round after the
	// GC has run.
	onlyLast := func() bool {
		ok := true
		walkFiles(t, cache, func(rel string) {
			ok = ok && (rel == CacheIndexName || strings.HasPrefix(rel, keep+"/"))
		})
		return ok
	}
	waitFor(t, 5*time.Second, func() bool {
		l := sb.Lag()
		return l.LastSynced == last.ID && l.CheckpointsBehind == 0 && l.Err == nil && onlyLast()
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
	data := t.TempDir()
	o := e.opts(data, 0)
	o.CacheDir = cache
	if r, err := Restore(e.ctx, last, o); err != nil || r.BytesDownloaded != 0 || r.BytesCache == 0 {
		t.Fatalf("restore from the cache: %+v %v", r, err)
	}
}

func TestProgressPrinter(t *testing.T) {
	var buf bytes.Buffer
	pp := ProgressPrinter(&buf, false)
	pp(Progress{Phase: PhaseFetch, BytesDone: 1 << 20, BytesTotal: 4 << 20, FilesDone: 1, FilesTotal: 4, Elapsed: time.Second})
	pp(Progress{Phase: PhaseFetch, BytesDone: 2 << 20, BytesTotal: 4 << 20, Elapsed: 2 * time.Second}) // throttled
	pp(Progress{Phase: PhaseDone, BytesDone: 4 << 20, BytesTotal: 4 << 20, FilesDone: 4, FilesTotal: 4, Elapsed: 3 * time.Second})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "25% 1.0MiB/4.0MiB files 1/4 1.0MiB/s eta 3s") || !strings.Contains(lines[1], "done") {
		t.Fatalf("plain output:\n%s", buf.String())
	}
	buf.Reset()
	tty := ProgressPrinter(&buf, true)
	tty(Progress{Phase: PhaseFetch, BytesDone: 1 << 20, BytesTotal: 2 << 20, Elapsed: time.Second})
	if !strings.HasPrefix(buf.String(), "\r\033[K") || !strings.Contains(buf.String(), "[===============               ]") {
		t.Fatalf("tty output %q", buf.String())
	}

	// Restore reports progress, ending with done.
	e := newEnv(t, nil, 16, 1, checkpoint.ModeIncremental, 11)
	e.write(2000, 4000, 40, 0)
	m, _ := e.checkpoint("")
	var got []Progress
	o := e.opts(t.TempDir(), 0)
	o.Progress = func(p Progress) { got = append(got, p) }
	o.ProgressEvery = time.Millisecond
	if _, err := Restore(e.ctx, m, o); err != nil {
		t.Fatal(err)
	}
	final := got[len(got)-1]
	if final.Phase != PhaseDone || final.BytesDone != m.Figures.FullStateSize || final.BytesTotal != final.BytesDone || final.FilesDone != len(m.Objects) {
		t.Fatalf("final progress %+v", final)
	}
}
