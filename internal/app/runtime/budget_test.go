package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/drill"
	"cairn/internal/base/datadir"
	"cairn/recovery"
	"cairn/recovery/model"
	"cairn/state"
)

// testModel is a restore model with known terms: 10 MB/s, no per-object
// latency, 0.1 s to open, decode 2 s per GiB.
func testModel(t *testing.T) *model.Model {
	t.Helper()
	dir := t.TempDir()
	st := model.State{
		Transfers: []model.Transfer{{Bytes: 10e6, Objects: 1, Seconds: 1, From: "restore"}, {Bytes: 20e6, Objects: 1, Seconds: 2, From: "restore"}},
		Open:      model.Term{Value: 0.1, Samples: 1},
		Decode:    model.Term{Value: 2, Samples: 1},
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, model.File), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return model.Load(dir)
}

// TestBudgetMode: the next checkpoint is full when an incremental one would
// restore beyond the budget (with an interval's headroom) and a full one
// faster, estimated from the measured ratio of a full checkpoint's size to
// the native state's; never otherwise.
func TestBudgetMode(t *testing.T) {
	mod := testModel(t)
	for _, c := range []struct {
		name     string
		budget   time.Duration
		st       budgetState
		wantFull bool
		unmet    bool
		reason   string
	}{
		{"no budget", 0, budgetState{incBytes: 50e6}, false, false, ""},
		{"nothing incremental yet", time.Second, budgetState{}, false, false, ""},
		// 5 MB: 0.5 s + 0.1 s open = 0.6 s; with headroom 0.66 s < 1 s.
		{"within", time.Second, budgetState{incBytes: 5e6}, false, false, ""},
		// 8.5 MB: 0.95 s; with headroom 1.045 s > 1 s: cut before crossing.
		{"before crossing, no full measured", time.Second, budgetState{incBytes: 8.5e6}, true, false, "no full checkpoint was measured yet"},
		// Full at half the size: 4.25 MB -> 0.43 s + decode + open.
		{"full halves the bytes", time.Second, budgetState{incBytes: 8.5e6, ratio: 0.5}, true, false, "a full one in"},
		// As large as the native state: slower (decode).
		{"full is slower", time.Second, budgetState{incBytes: 8.5e6, ratio: 1}, false, true, "cannot be met"},
		// 30 MB native, full half: 1.5 s + decode > 1 s: full, still unmet.
		{"full better but over", time.Second, budgetState{incBytes: 30e6, ratio: 0.5}, true, true, "a full one in"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := budgetMode(c.budget, c.st, 2, 128, mod)
			if d.Full != c.wantFull || d.Unmet != c.unmet || !strings.Contains(d.Reason, c.reason) {
				t.Fatalf("got %+v, want full %v unmet %v reason containing %q", d, c.wantFull, c.unmet, c.reason)
			}
		})
	}
	if d := budgetMode(time.Second, budgetState{incBytes: 50e6}, 2, 128, model.New()); d.Full || d.Reason != "" {
		t.Fatalf("an uncalibrated model decided: %+v", d)
	}
	// Without a decode term, the fetch alone decides.
	noDecode := model.New()
	for _, tr := range []model.Transfer{{Bytes: 10e6, Objects: 1, Seconds: 1}, {Bytes: 20e6, Objects: 1, Seconds: 2}} {
		_ = noDecode.ObserveTransfer(tr)
	}
	if d := budgetMode(time.Second, budgetState{incBytes: 20e6, ratio: 0.5}, 2, 128, noDecode); !d.Full || !strings.Contains(d.Reason, "not calibrated") {
		t.Fatalf("half the bytes, decode unknown: %+v", d)
	}
	if d := budgetMode(time.Second, budgetState{incBytes: 20e6, ratio: 0.95}, 2, 128, noDecode); d.Full || !d.Unmet {
		t.Fatalf("as many bytes, decode unknown: %+v", d)
	}
	// observe: the ratio, and the native size a full checkpoint implies.
	var b budgetState
	b.observe(&checkpoint.Manifest{Mode: checkpoint.ModeIncremental, Figures: checkpoint.Figures{FullStateSize: 10e6, FilesUploaded: 3, FilesReused: 5}})
	b.observe(&checkpoint.Manifest{Mode: checkpoint.ModeFull, Figures: checkpoint.Figures{FullStateSize: 6e6}})
	b.observe(&checkpoint.Manifest{Mode: checkpoint.ModeFull, Figures: checkpoint.Figures{FullStateSize: 9e6}})
	if b.ratio != 0.6 || b.incBytes != 15e6 || b.incObjects != 8 || b.incMeasured {
		t.Fatalf("budget state %+v, want ratio 0.6, native 15 MB, 8 objects", b)
	}
}

// TestRestoreBudgetThrottledStore: a job's committer over a store
// throttled to 8 MB/s, the state growing every checkpoint, a budget of
// 0.75 s, a restore model that knows the bandwidth. Every
// incremental checkpoint committed is predicted (at commit time) to
// restore within the budget; the chain is cut by full checkpoints before
// it would cross it; the newest checkpoint restores exactly (its measured
// restore time is logged).
func TestRestoreBudgetThrottledStore(t *testing.T) {
	ctx := context.Background()
	fs, err := checkpoint.NewFileStore(filepath.Join(t.TempDir(), "store"), true)
	if err != nil {
		t.Fatal(err)
	}
	store := drill.NewThrottledStore(fs, 8e6)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	const keyGroups, slots = 32, 2
	w, err := checkpoint.NewWriter(ctx, store, checkpoint.WriterConfig{Job: "budget", KeyGroups: keyGroups, Slots: slots, Retain: 3, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	// The model knows the store's bandwidth from two downloads (a real
	// node learns it from its restores and standby syncs; uploads alone
	// calibrate it only roughly, and through the throttle's burst a small
	// upload can look faster than the link): the decisions below then
	// follow the state's size alone, whatever the machine's load.
	mod := model.Load(t.TempDir())
	for _, tr := range []model.Transfer{{Bytes: 8e6, Objects: 1, Seconds: 1, From: "restore"}, {Bytes: 16e6, Objects: 1, Seconds: 2, From: "restore"}} {
		if err := mod.ObserveTransfer(tr); err != nil {
			t.Fatal(err)
		}
	}
	var logs strings.Builder
	c := &committer{log: slog.New(slog.NewTextHandler(&logs, nil)), w: w, stream: "in", store: store, job: "budget", model: mod, budget: 750 * time.Millisecond, slots: slots, keyGroups: keyGroups}
	var dbs []*state.DB
	base := t.TempDir()
	for i := range slots {
		db, err := state.Open(datadir.SlotIn(base, i), state.Options{KeyGroups: keyGroups, Range: state.SlotRange(i, slots, keyGroups)})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dbs = append(dbs, db)
	}
	local := t.TempDir()
	val := make([]byte, 200)
	rng := rand.New(rand.NewPCG(1, 2))
	key := 0
	fulls, predicted := 0, 0
	for id := uint64(1); id <= 16; id++ {
		// ~0.5 MB of new state per checkpoint (random values do not
		// compress).
		for range 3000 {
			k := fmt.Appendf(nil, "key-%09d", key)
			key++
			for j := range val {
				val[j] = "0123456789abcdef"[rng.IntN(16)]
			}
			kg := state.KeyGroup(k, keyGroups)
			b := dbs[state.SlotOf(kg, slots, keyGroups)].NewBatch()
			b.Put(1, kg, k, nil, val)
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			b.Close()
		}
		// What the committer will decide, from what it knows now.
		c.mu.Lock()
		st := c.mu.budget
		if !c.mu.seeded {
			st = budgetState{}
		}
		c.mu.Unlock()
		pred := budgetMode(c.budget, st, slots, keyGroups, mod)
		var snaps []state.SlotSnapshot
		for i, db := range dbs {
			sd := datadir.SlotIn(datadir.Checkpoint(local, id), i)
			if err := db.Checkpoint(sd); err != nil {
				t.Fatal(err)
			}
			snaps = append(snaps, state.SlotSnapshot{Slot: i, Range: db.Range(), Dir: sd})
		}
		if err := c.Commit(ctx, engine.Barrier{ID: id, SourceSeq: id, Slots: snaps}); err != nil {
			t.Fatal(err)
		}
		m := w.Latest()
		if pred.Full != (m.Mode == checkpoint.ModeFull) {
			t.Fatalf("checkpoint %d is %s, the budget decided %+v", id, m.Mode, pred)
		}
		if m.Mode == checkpoint.ModeFull {
			fulls++
			if c.reason(id) == "" {
				t.Fatalf("full checkpoint %d has no reason", id)
			}
			continue
		}
		p := mod.PredictLowerBound(recovery.StoreInput(m.Mode, slots, keyGroups, m.Figures))
		if p.OK {
			predicted++
		}
		if p.OK && p.Seconds > c.budget.Seconds() {
			t.Fatalf("incremental checkpoint %d is predicted to restore in %.2f s, over the %v budget: the chain was not cut before", id, p.Seconds, c.budget)
		}
	}
	if predicted < 3 {
		t.Fatalf("only %d incremental checkpoints had a prediction", predicted)
	}
	if fulls == 0 {
		t.Fatalf("the state grew past the budget and no checkpoint was full\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "restore budget: this checkpoint is full") {
		t.Fatalf("no log line for the full checkpoints:\n%s", logs.String())
	}
	newest := w.Latest()
	start := time.Now()
	if _, err := recovery.Restore(ctx, newest, recovery.Options{Store: store, Job: "budget", KeyGroups: keyGroups, DataDir: t.TempDir(), Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	p := mod.PredictLowerBound(recovery.StoreInput(newest.Mode, slots, keyGroups, newest.Figures))
	t.Logf("%d of 16 checkpoints full; newest %d (%s, %.1f MB) restored from the throttled store in %v, predicted %s, budget %v",
		fulls, newest.ID, newest.Mode, float64(newest.Figures.FullStateSize)/1e6, time.Since(start).Round(time.Millisecond), p.Short(), c.budget)
}
