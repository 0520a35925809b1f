package demo

import (
	"context"
	"crypto/sha256"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
	"cairn/recovery"
	"cairn/recovery/model"
)

// calibrate measures what the restore model needs while the job runs, each
// when no other restore does: a restore of the latest checkpoint from the
// job's local copy (the open time), transfers from the store through the
// link (the bandwidth, and the per-request latency), and, the first time a
// full checkpoint appears, its rebuild; again every 5 minutes (the state
// grows). Transfers rather than whole restores measure the link: at scale a
// restore from the store takes tens of seconds and holds a copy of the
// state on disk, while two seconds of download measure the same bandwidth,
// so the model is calibrated within the demo's first minute.
func (d *demo) calibrate(ctx context.Context) {
	d.mu.Lock()
	running := d.mu.child != nil && d.mu.story.Phase == phaseRunning
	slots := d.mu.slots
	due := time.Since(d.mu.lastCalibration) > 5*time.Minute
	fullDone := d.mu.calibratedFullID
	d.mu.Unlock()
	if !running || !d.restoreMu.TryLock() {
		return
	}
	defer d.restoreMu.Unlock()
	m, err := checkpoint.Latest(ctx, d.store, demoJobName)
	if err != nil {
		return
	}
	scratch := filepath.Join(d.dir, "calibrate")
	defer os.RemoveAll(scratch)
	restore := func(store checkpoint.Store, localDir string, slots int) *recovery.Result {
		_ = os.RemoveAll(scratch)
		o := d.restoreOptions(scratch, localDir, slots)
		o.Store = store
		res, err := recovery.Restore(ctx, m, o)
		if err != nil {
			return nil // the job replaced its local copy meanwhile: next time
		}
		return res
	}
	rescaled := min(slots+1, recovery.MaxRescaleFactor*m.SlotCount(), demoKeyGroups)
	switch {
	case m.Mode == checkpoint.ModeIncremental && (due || !d.model.calibrated(model.Incremental)):
		if m.SlotCount() != slots {
			return
		}
		local := datadir.Checkpoints(d.jobDir)
		if p, err := recovery.PlanRestore(m, d.restoreOptions(scratch, local, slots)); err == nil && p.BytesDownload == 0 {
			if res := restore(d.store, local, slots); res != nil {
				d.model.observeResult(res)
			}
			// A rescale onto one slot more, from the same local copy:
			// the move term (the key groups a new slot scans from an old
			// slot that is not its base), so that the rescale preview
			// predicts before the first rescale. Nothing crosses the link.
			// Measured here it shares the cores with the running job, so
			// only while nothing better is known (calibrateMove measures
			// it before a bulk-loaded job starts; a rescale measures it).
			if p, err := recovery.PlanRestore(m, d.restoreOptions(scratch, local, rescaled)); err == nil && p.BytesRebuild > 0 && p.BytesDownload == 0 && !d.model.m.Terms()[model.TermMove].Known() {
				if res := restore(d.store, local, rescaled); res != nil {
					d.model.observeResult(res)
				}
			}
		}
		d.sampleLink(ctx, m)
		d.mu.Lock()
		d.mu.lastCalibration = time.Now()
		d.mu.Unlock()
	case m.Mode == checkpoint.ModeFull && m.ID != fullDone && d.model.calibrated(model.Incremental):
		for _, n := range []int{slots, rescaled} {
			if d.cfg.link.Off() {
				if res := restore(d.store, "", n); res != nil {
					d.model.observeResult(res)
				}
				continue
			}
			// Behind a link the fetch would hide the rebuild (the two
			// overlap): the rebuild is measured from the store's own disk,
			// as a restore that fetches nothing.
			if res := restore(d.store, "", n); res != nil {
				in := recovery.ResultInput(res, 0)
				in.Source, in.BytesFetch, in.Objects, in.Requests, in.SSTs = model.SourceLocal, 0, 0, 0, 0
				_, _ = d.model.m.ObserveRestore(in, res.Duration, "demo: full restore, rebuild")
			}
		}
		d.mu.Lock()
		d.mu.calibratedFullID = m.ID
		d.mu.Unlock()
	}
}

// sampleLink measures the store through the link as the restores use it:
// a small transfer (Pebble's small files, a few requests: the per-request
// latency) and a large one (SSTs cycled until about two seconds' worth at
// the link's bandwidth, at least 4 MiB: the bandwidth), each at the
// restore's download parallelism.
func (d *demo) sampleLink(ctx context.Context, m *checkpoint.Manifest) {
	var small, large []checkpoint.Object
	var smallBytes int64
	for _, o := range m.Objects {
		switch {
		case o.Size <= 0:
		case o.Size < 64<<10 && smallBytes+o.Size < model.MinFetchBytes && len(small) < model.DefaultParallelism:
			small = append(small, o)
			smallBytes += o.Size
		case o.Size >= 64<<10:
			large = append(large, o)
		}
	}
	if len(small) > 0 {
		if t, ok := d.transfer(ctx, small, 0); ok {
			_ = d.model.m.ObserveTransfer(t)
		}
	}
	if len(large) > 0 {
		target := int64(4 << 20)
		if bw := d.cfg.link.Bandwidth; bw > 0 {
			target = max(target, 2*bw)
		}
		if t, ok := d.transfer(ctx, large, target); ok {
			_ = d.model.m.ObserveTransfer(t)
		}
	}
}

// transfer downloads objs (cycling through them until target bytes when
// target > 0) through the linked store, DefaultParallelism at a time, each
// into a file that is hashed and synced as a restore does with what it
// downloads: the sample's time holds the disk's and the CPU's share of a
// restore's download, not only the link's.
func (d *demo) transfer(ctx context.Context, objs []checkpoint.Object, target int64) (model.Transfer, bool) {
	var list []checkpoint.Object
	var total int64
	for i := 0; target <= 0 && i < len(objs) || target > 0 && total < target; i++ {
		o := objs[i%len(objs)]
		list = append(list, o)
		total += o.Size
	}
	work := make(chan checkpoint.Object)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got int64
	failed := false
	start := time.Now()
	for range model.DefaultParallelism {
		wg.Go(func() {
			for o := range work {
				n, err := d.fetchObject(ctx, o.Path)
				mu.Lock()
				got += n
				failed = failed || err != nil
				mu.Unlock()
			}
		})
	}
	for _, o := range list {
		work <- o
	}
	close(work)
	wg.Wait()
	_ = os.RemoveAll(filepath.Join(d.dir, "calibrate"))
	if failed || got == 0 {
		return model.Transfer{}, false // retention deleted one meanwhile: next time
	}
	return model.Transfer{Bytes: got, Objects: len(list), Parallelism: model.DefaultParallelism,
		Seconds: time.Since(start).Seconds(), From: "demo: link sample"}, true
}

// fetchObject downloads one object through the link into a scratch file,
// hashing and syncing it, and removes the file.
func (d *demo) fetchObject(ctx context.Context, name string) (int64, error) {
	dir := filepath.Join(d.dir, "calibrate")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	f, err := os.CreateTemp(dir, "sample-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	rc, err := d.linked.Get(ctx, name)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), rc)
	if err != nil {
		return n, err
	}
	_ = h.Sum(nil)
	return n, f.Sync()
}

// calibrateMove measures the restore model's open and move terms with
// restores of the bulk-loaded checkpoint from its local copy, onto the
// job's slot count and onto one slot more, before the job process starts.
// Measured while the job ran, the rescale shared the two cores with it and
// came out 3× slower than the job's own rescale, which runs while the job
// is down. Nothing crosses the link.
func (d *demo) calibrateMove(ctx context.Context, slots int) {
	m, err := checkpoint.Latest(ctx, d.store, demoJobName)
	if err != nil || m.Mode != checkpoint.ModeIncremental {
		return
	}
	scratch := filepath.Join(d.dir, "calibrate")
	defer os.RemoveAll(scratch)
	local := datadir.Checkpoints(d.jobDir)
	for _, n := range []int{slots, min(slots+1, recovery.MaxRescaleFactor*m.SlotCount(), demoKeyGroups)} {
		o := d.restoreOptions(scratch, local, n)
		o.Store = d.store
		if p, err := recovery.PlanRestore(m, o); err != nil || p.BytesDownload > 0 || (n != slots && p.BytesRebuild == 0) {
			return
		}
		_ = os.RemoveAll(scratch)
		res, err := recovery.Restore(ctx, m, o)
		if err != nil {
			return
		}
		d.model.observeResult(res)
	}
}
