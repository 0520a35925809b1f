package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/runtime"
	"cairn/internal/app/storelink"
	"cairn/internal/base/datadir"
	"cairn/state"
)

// ballastValueLen is the size of one ballast value: large values, so that
// hundreds of MiB are a hundred thousand keys whose list fits in a few MiB
// of the demo's memory while they are sorted into their key groups.
const ballastValueLen = 4 << 10

// ballastKey is the user key of ballast entry i. No generated word starts
// with '~' (the corpus is lowercase letters), so the job never reads or
// writes one, and the demo's exactly-once check, which follows the words,
// never sees them.
func ballastKey(dst []byte, i int) []byte { return fmt.Appendf(dst[:0], "~ballast/%08d", i) }

// seedResult is what seedState built.
type seedResult struct {
	Keys    int
	Bytes   int64 // the checkpoint's full state size
	Files   int
	Elapsed time.Duration
}

// seedState builds size bytes of keyed state for the demo's job in its data
// directory and commits it to the store as the job's first checkpoint
// (source sequence 0: the job still reads its input from the start), with
// the job's local copy of it, so that the job's first start restores it
// locally. It stands in for a state that grew over months: the entries
// are ingested as sorted SST files (state.IngestSorted) straight into the
// bottom level, which takes seconds where writing them as records would
// take many minutes. Its upload is not throttled: the months it stands for
// uploaded it long ago.
func seedState(ctx context.Context, store checkpoint.Store, jobDir string, slots int, size int64, log *slog.Logger) (seedResult, error) {
	start := time.Now()
	n := int(max(1, size/ballastValueLen))
	// Sort the keys into their key groups, each group's by encoded key.
	byKG := make([][]int, demoKeyGroups)
	var uk []byte
	for i := range n {
		uk = ballastKey(uk, i)
		kg := state.KeyGroup(uk, demoKeyGroups)
		byKG[kg] = append(byKG[kg], i)
	}
	for kg := range byKG {
		slices.SortFunc(byKG[kg], func(a, b int) int {
			return bytes.Compare(ballastKey(nil, a), ballastKey(nil, b))
		})
	}
	if err := os.RemoveAll(jobDir); err != nil {
		return seedResult{}, fmt.Errorf("demo: seed: %w", err)
	}
	const id = 1
	chk := datadir.Checkpoint(datadir.Checkpoints(jobDir), id)
	snaps := make([]state.SlotSnapshot, slots)
	errs := make([]error, slots)
	var wg sync.WaitGroup
	for s := range slots {
		wg.Go(func() {
			errs[s] = seedSlot(jobDir, chk, s, slots, byKG, &snaps[s])
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			_ = os.RemoveAll(jobDir)
			return seedResult{}, err
		}
	}
	w, err := checkpoint.NewWriter(ctx, store, checkpoint.WriterConfig{
		Job: demoJobName, KeyGroups: demoKeyGroups, Slots: slots, Mode: checkpoint.ModeIncremental, Retain: 3, Logger: log,
	})
	if err != nil {
		return seedResult{}, fmt.Errorf("demo: seed: %w", err)
	}
	defer w.Close(ctx)
	m, err := w.Commit(ctx, id, checkpoint.Meta{SourceStream: demoInputStream, SourceSeq: 0, ABIVersion: 1}, snaps)
	if err != nil {
		return seedResult{}, fmt.Errorf("demo: seed: commit: %w", err)
	}
	// The live DBs are the restore's to rebuild from the local copy.
	if err := os.RemoveAll(datadir.State(jobDir)); err != nil {
		return seedResult{}, fmt.Errorf("demo: seed: %w", err)
	}
	return seedResult{Keys: n, Bytes: m.Figures.FullStateSize, Files: len(m.Objects), Elapsed: time.Since(start)}, nil
}

// seedSlot ingests slot s's key groups of ballast and takes its local
// checkpoint into chk.
func seedSlot(jobDir, chk string, s, slots int, byKG [][]int, snap *state.SlotSnapshot) error {
	rng := state.SlotRange(s, slots, demoKeyGroups)
	db, err := state.IngestSorted(datadir.Slot(jobDir, s), state.Options{KeyGroups: demoKeyGroups, Range: rng, NoWAL: true},
		func(yield func(key, value []byte) error) error {
			r := rand.NewChaCha8([32]byte{byte(s)})
			val := make([]byte, ballastValueLen)
			var uk []byte
			for kg := rng.First; kg <= rng.Last; kg++ {
				for _, i := range byKG[kg] {
					uk = ballastKey(uk, i)
					// The value header's first byte 0: no expiry; the rest
					// does not compress, as state rarely does once Pebble
					// has compressed its blocks.
					val[0] = 0
					_, _ = r.Read(val[1:])
					if err := yield(state.ValueKey(kg, engine.KeyedStageID, uk, nil), val); err != nil {
						return err
					}
				}
			}
			return nil
		})
	if err != nil {
		return fmt.Errorf("demo: seed slot %d: %w", s, err)
	}
	dir := datadir.SlotIn(chk, s)
	t := time.Now()
	if err := db.Checkpoint(dir); err != nil {
		_ = db.Close()
		return fmt.Errorf("demo: seed slot %d: checkpoint: %w", s, err)
	}
	*snap = state.SlotSnapshot{Slot: s, Range: rng, Dir: dir, SyncDuration: time.Since(t)}
	if err := db.Close(); err != nil {
		return fmt.Errorf("demo: seed slot %d: %w", s, err)
	}
	return nil
}

// seed says what the demo simulates at scale, and bulk-loads the state
// when the store has no checkpoint of the job yet.
func (d *demo) seed(ctx context.Context) error {
	c := d.cfg
	if !c.link.Off() {
		lat := ""
		if c.link.Latency > 0 {
			lat = fmt.Sprintf(" and %s per request", c.link.Latency)
		}
		d.say(fmt.Sprintf("cairn demo: the checkpoint store is behind a simulated network link (%s each way%s), as an object store is; the job's local disk is not",
			strings.TrimSuffix(storelink.Link{Bandwidth: c.link.Bandwidth}.String(), "off"), lat))
	}
	if c.stateSize <= 0 {
		return nil
	}
	m, err := checkpoint.Latest(ctx, d.store, demoJobName)
	switch {
	case err == nil:
		d.say(fmt.Sprintf("cairn demo: carrying on from checkpoint #%d (%s of state); remove %s to bulk-load again", m.ID, runtime.FormatBytes(uint64(m.Figures.FullStateSize)), d.dir))
		return nil
	case !errors.Is(err, checkpoint.ErrNotFound):
		return err
	}
	d.mu.Lock()
	slots := d.mu.slots
	d.mu.Unlock()
	d.say(fmt.Sprintf("cairn demo: bulk-loading %s of keyed state (%d keys of %s, standing in for state that grew over months; the word count never touches it) ...",
		runtime.FormatBytes(uint64(c.stateSize)), max(1, c.stateSize/ballastValueLen), runtime.FormatBytes(ballastValueLen)))
	res, err := seedState(ctx, d.store, d.jobDir, slots, c.stateSize, d.log)
	if err != nil {
		return err
	}
	line := fmt.Sprintf("cairn demo: bulk-loaded %s in %s as checkpoint #1 (%d files); the job restores it from its local copy",
		runtime.FormatBytes(uint64(res.Bytes)), fmtDuration(res.Elapsed), res.Files)
	if c.link.Bandwidth > 0 {
		line += fmt.Sprintf("; downloading it over the link takes at least %s", fmtDuration(time.Duration(float64(res.Bytes)/float64(c.link.Bandwidth)*float64(time.Second))))
	}
	d.say(line)
	d.calibrateMove(ctx, slots)
	d.seedID = 1
	mem := loadDemoMemory(d.dir)
	mem.Seed = d.seedID
	return saveDemoMemory(d.dir, mem)
}
