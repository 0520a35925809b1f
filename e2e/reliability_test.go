package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/cli"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/base/failpoint"
)

// waitKilledAt waits for the child to die at the armed failpoint.
func waitKilledAt(t *testing.T, h *harness, done chan error, name string) {
	t.Helper()
	select {
	case err := <-done:
		var ee interface{ Sys() any }
		if !errors.As(err, &ee) {
			t.Fatalf("failpoint %s: child exited with %v, want SIGKILL\n%s", name, err, tail(h.logs.String(), 4000))
		}
		if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("failpoint %s: child exited with %v, want SIGKILL\n%s", name, err, tail(h.logs.String(), 4000))
		}
		if !strings.Contains(h.logs.String(), "failpoint "+name+" hit") {
			t.Fatalf("failpoint %s: the child died, but not at the failpoint\n%s", name, tail(h.logs.String(), 4000))
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("failpoint %s was never hit\n%s", name, tail(h.logs.String(), 4000))
	}
}

// storeClean checks every retained checkpoint verifies clean, then sweeps
// orphans with no grace period and checks nothing unreferenced is left.
func storeClean(t *testing.T, storeURL, jobName string) {
	t.Helper()
	ctx := context.Background()
	s, err := checkpoint.OpenStore(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	list, err := checkpoint.List(ctx, s, jobName)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) == 0 {
		t.Fatal("no committed checkpoint in the store")
	}
	for _, e := range list {
		probs, err := checkpoint.Verify(ctx, s, jobName, e.ID)
		if err != nil {
			t.Fatalf("verify %d: %v", e.ID, err)
		}
		for _, p := range probs {
			if !errors.Is(p.Err, checkpoint.ErrUnexpectedObject) { // leftovers of a crashed upload are swept below
				t.Errorf("checkpoint %d: broken object %s: %v", e.ID, p.Object, p.Err)
			}
		}
	}
	if _, err := checkpoint.GC(ctx, s, jobName, len(list), 0, false); err != nil {
		t.Fatal(err)
	}
	rep, err := checkpoint.GC(ctx, s, jobName, len(list), 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Deleted) != 0 {
		t.Errorf("after a sweep, %d unreferenced objects remain: %v", len(rep.Deleted), rep.Deleted)
	}
}

// TestCrashPoints arms each named failpoint of the checkpoint commit, of
// retention and of restore in turn: the child dies there (SIGKILL, no
// cleanup), a restart recovers, counts are exact, every retained
// checkpoint verifies clean and the orphan sweep leaves nothing behind.
func TestCrashPoints(t *testing.T) {
	for i, fp := range []string{
		failpoint.CheckpointAfterUpload, failpoint.CheckpointBeforeManifest, failpoint.CheckpointAfterManifest,
		failpoint.GCAfterManifestDelete,
		failpoint.RestoreDuringDownload, failpoint.RestoreBeforeSwap, failpoint.RestoreBeforeOpen,
	} {
		t.Run(fp, func(t *testing.T) {
			mode := []string{"incremental", "full"}[i%2]
			h := newHarness(t, harnessConfig{store: []string{"file", "s3"}[i%2], mode: mode, delivery: "exactly_once", interval: "100ms", retain: 1})
			h.publish(4000)
			env := failpoint.EnvVar + "=" + fp
			if strings.HasPrefix(fp, "restore-") {
				// A checkpoint to restore first: run, then kill.
				cmd, done := h.start()
				for {
					if st, ok := h.stats(); ok && st.Checkpoints >= 2 {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				_ = cmd.Process.Signal(syscall.SIGKILL)
				<-done
				h.publish(2000)
				if fp == failpoint.RestoreDuringDownload {
					// From the store, not the local copy: a fresh data dir.
					if err := os.RemoveAll(h.data); err != nil {
						t.Fatal(err)
					}
				}
			} else if fp == failpoint.GCAfterManifestDelete {
				env += "@1" // retain 1: the second commit drops the first
			}
			_, done := h.start(env)
			waitKilledAt(t, h, done, fp)
			h.publish(1000)
			h.runToEnd()
			h.verify()
			storeClean(t, h.store, "killed")
		})
	}
}

// corrupt applies one kind of damage to the object at path p.
func corrupt(t *testing.T, p, how string, rng *rand.Rand) {
	t.Helper()
	switch how {
	case "bitflip":
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		i := rng.IntN(len(b))
		b[i] ^= 1 << rng.IntN(8)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	case "truncate":
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, st.Size()/2); err != nil {
			t.Fatal(err)
		}
	case "zero":
		if err := os.Truncate(p, 0); err != nil {
			t.Fatal(err)
		}
	case "delete":
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	case "extra":
		if err := os.WriteFile(filepath.Join(filepath.Dir(p), "UNKNOWN-extra"), []byte("stray"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCorruptionMatrix damages every kind of object of a checkpoint in
// every way and checks: no silent success. `checkpoints verify` names the
// object; a restore refuses with a typed error naming it and leaves the
// data directory untouched; with restore.fallback: previous it restores the
// older checkpoint instead. An extra unknown file is reported by verify and
// ignored by restore (it is not part of the checkpoint).
func TestCorruptionMatrix(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CAIRN_CORRUPT_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d (rerun: CAIRN_CORRUPT_SEED=%d go test ./e2e -run TestCorruptionMatrix)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for _, mode := range []string{"incremental", "full"} {
		t.Run(mode, func(t *testing.T) {
			url0 := startNATS(t)
			_, js := connectJS(t, url0)
			createStream(t, js, "EVENTS", "events.>")
			storeDir := t.TempDir()
			store := "file://" + storeDir + "?create_dir=true"
			model := map[string]int{}
			publishKeyed(t, url0, 0, 3000, model)
			yaml := fmt.Sprintf(rescaleJob, url0, 2, t.TempDir(), store, mode)
			r, stop := runJob(t, yaml)
			waitProcessed(t, r.Engine, 3000)
			id1, _ := r.Engine.TriggerCheckpoint(context.Background(), engine.CheckpointRequest{})
			if ev, err := r.Engine.WaitCheckpoint(context.Background(), id1); err != nil || ev.Err != nil {
				t.Fatalf("checkpoint: %v %v", err, ev.Err)
			}
			publishKeyed(t, url0, 3000, 4000, model)
			waitProcessed(t, r.Engine, 4000)
			if err := stop(); err != nil { // the stop commits the newest checkpoint
				t.Fatal(err)
			}
			ctx := context.Background()
			s, err := checkpoint.OpenStore(ctx, store)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			latest, err := checkpoint.Latest(ctx, s, "rescale")
			if err != nil {
				t.Fatal(err)
			}
			targets := map[string]string{"manifest": checkpoint.ManifestPath("rescale", latest.ID)}
			for _, o := range latest.Objects {
				k := string(o.Kind)
				if _, ok := targets[k]; !ok && o.Size > 0 {
					targets[k] = o.Path
				}
			}
			for kind, obj := range targets {
				for _, how := range []string{"bitflip", "truncate", "zero", "delete", "extra"} {
					if how == "extra" && kind == "sst" {
						// shared/ holds no checkpoint's folder: a stray file there
						// is an orphan, which `checkpoints gc --dry-run` lists.
						continue
					}
					t.Run(kind+"-"+how, func(t *testing.T) {
						// Damage a copy of the store.
						cp := t.TempDir()
						if err := os.CopyFS(cp, os.DirFS(storeDir)); err != nil {
							t.Fatal(err)
						}
						corrupt(t, filepath.Join(cp, obj), how, rng)
						cpURL := "file://" + cp
						var out strings.Builder
						code := cli.Main([]string{"checkpoints", "verify", fmt.Sprint(latest.ID), "--store", cpURL, "--job", "rescale"}, &out, &out)
						if code == 0 {
							t.Fatalf("verify passed a checkpoint with %s %s (%s):\n%s", kind, how, obj, out.String())
						}
						named := obj
						if how == "extra" {
							named = "UNKNOWN-extra"
						}
						if !strings.Contains(out.String(), named) {
							t.Fatalf("verify does not name %s:\n%s", named, out.String())
						}
						// Restore into a fresh data dir (no local copy to mask the damage).
						data := t.TempDir()
						if err := os.WriteFile(filepath.Join(data, "keep"), []byte("x"), 0o644); err != nil {
							t.Fatal(err)
						}
						before := treeDigest(t, data)
						j, err := job.Parse([]byte(fmt.Sprintf(rescaleJob, url0, 2, data, cpURL, mode)))
						if err != nil {
							t.Fatal(err)
						}
						r, err := runtime.Start(ctx, j, runtime.Options{}, testLogger(t))
						if kind == "manifest" && how == "delete" {
							// No manifest, no checkpoint: the older one is the latest.
							if err != nil || r.Restored == nil || r.Restored.ID >= latest.ID {
								t.Fatalf("with the newest manifest deleted: restored %+v, %v", r, err)
							}
							r.Close()
							return
						}
						if how == "extra" {
							if err != nil {
								t.Fatalf("an extra unknown file made restore fail: %v", err)
							}
							r.Close()
							return
						}
						if err == nil {
							r.Close()
							t.Fatalf("restore succeeded over %s %s", kind, how)
						}
						if !checkpoint.IsCorruption(err) && !errors.Is(err, checkpoint.ErrNotFound) {
							t.Fatalf("restore error is not typed (corruption / not found): %v", err)
						}
						if !strings.Contains(err.Error(), obj) && !(kind == "manifest") {
							t.Fatalf("restore error does not name %s: %v", obj, err)
						}
						if after := treeDigest(t, data); after != before {
							t.Fatal("a refused restore changed the data directory")
						}
						// With restore.fallback: previous, the older checkpoint is restored.
						j.Restore.Fallback = "previous"
						r, err = runtime.Start(ctx, j, runtime.Options{}, testLogger(t))
						if kind == "sst" && mode == "incremental" {
							// The SST may be shared with the older checkpoint: then no
							// intact checkpoint exists, and the fallback must say so.
							if err != nil {
								if !strings.Contains(err.Error(), "no intact checkpoint") {
									t.Fatalf("fallback: %v", err)
								}
								return
							}
						} else if err != nil {
							t.Fatalf("fallback to the previous checkpoint: %v", err)
						}
						defer r.Close()
						if r.Restored == nil || r.Restored.ID >= latest.ID {
							t.Fatalf("fallback restored %+v, want a checkpoint older than %d", r.Restored, latest.ID)
						}
					})
				}
			}
		})
	}
}
