// Package online is the background half of an online restore: the job
// processes while the SSTs it restored are still in the store; a Download
// fetches them at a bounded rate, holds a lease on them in the store so that
// no retention or GC deletes them meanwhile, and marks the restore failed
// (so that the next start restores whole) if one turns out corrupt.
package online

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/base/datadir"
	"cairn/recovery"
	"cairn/state"
)

// Download is one online restore's background download
// (docs/RATIONALE.md, "Online restore"): it fails the job if one of the
// objects turns out corrupt.
type Download struct {
	res   *recovery.Result
	store checkpoint.Store
	job   string
	data  string // the data directory (the failure marker's)
	// removeHook takes away the fatal hook that marks this restore failed.
	removeHook func()
	rate       int64
	log        *slog.Logger
	lease      *checkpoint.LeaseHolder
	start      time.Time

	// Verified, when set, is called with the restore's remote objects once
	// the download has fetched and checked every one (the checkpoint
	// writer's Restored).
	Verified func([]checkpoint.Object) int
	// Unread, when set, is called with the restore's remote objects the
	// download never read (the state deleted them first): the checkpoint
	// writer's Unread, which ends their hold on retention and leaves them
	// to the scrub.
	Unread func([]checkpoint.Object) int

	mu struct {
		sync.Mutex
		// fullyLocal is the time from the start of processing until the
		// last file was local and verified (0 while downloading).
		fullyLocal time.Duration
		err        error
	}
}

// Concurrency is how many files an online restore downloads at once.
const Concurrency = 4

// Start takes the lease for an online restore's remote objects; the
// download starts with the engine (Run).
func Start(ctx context.Context, res *recovery.Result, store checkpoint.Store, job, data string, rate int64, log *slog.Logger) (*Download, error) {
	d := &Download{res: res, store: store, job: job, data: data, rate: rate, log: log}
	host, _ := os.Hostname()
	holder := fmt.Sprintf("%s-%d-%s", cmp.Or(host, "node"), os.Getpid(), strconv.FormatInt(time.Now().UnixNano()%1e9, 36))
	l := checkpoint.Lease{Job: job, Holder: sanitizeHolder(holder), Checkpoint: res.ID, Objects: res.Remote.Objects()}
	lh, err := checkpoint.HoldLease(ctx, store, l, checkpoint.DefaultLeaseTTL, log)
	if err != nil {
		return nil, fmt.Errorf("online restore: lease the checkpoint's objects: %w", err)
	}
	d.lease = lh
	// The lease protects the objects from every deletion that starts after
	// it is written (retention reads leases after dropping manifests). One
	// that ran during the restore could have dropped the checkpoint: then
	// its objects may be gone, and a restart restores the newest one.
	if _, err := store.Stat(ctx, checkpoint.ManifestPath(job, res.ID)); err != nil && res.Savepoint == "" {
		_ = lh.Release(ctx)
		return nil, fmt.Errorf("online restore: checkpoint %d was deleted while it was restored (%w); start again to restore the newest", res.ID, err)
	}
	// A Pebble fatal error while files are remote (a corrupt block read in
	// the background) panics; the marker makes the restart download. Each
	// sub-topology of a graph restores on its own, into its own state
	// directory: a message that names a file marks only the restore whose
	// directory it is in (one naming none marks every restore still online).
	stateDir := datadir.State(data) + string(filepath.Separator)
	d.removeHook = state.AddFatalHook(func(msg string) {
		if files, _ := res.Remote.Remaining(); files > 0 && (strings.Contains(msg, stateDir) || !strings.Contains(msg, string(filepath.Separator))) {
			d.MarkFailed(errors.New(msg))
		}
	})
	files, bytes := res.Remote.Remaining()
	log.Info("online restore: processing starts now; the state downloads in the background",
		"checkpoint", res.ID, "files_remote", files, "bytes_remote", bytes, "download_rate", rateText(rate), "lease", l.Holder)
	return d, nil
}

// Run downloads until every file is local (then releases the lease) or ctx
// ends; a failure, such as an object whose checksum is wrong, fails e.
func (d *Download) Run(ctx context.Context, e *engine.Engine) {
	d.start = time.Now()
	renew := time.NewTicker(checkpoint.DefaultLeaseTTL / 4)
	defer renew.Stop()
	done := make(chan error, 1)
	go func() { done <- d.res.Remote.Download(ctx, d.rate, Concurrency) }()
	for {
		select {
		case <-renew.C:
			// Files that are local need the lease no more (the holder
			// renews it by itself: write only a shorter list).
			if objs := d.res.Remote.Objects(); len(objs) < len(d.lease.Lease().Objects) {
				_ = d.lease.Update(ctx, objs)
			}
		case err := <-done:
			if ctx.Err() != nil {
				return
			}
			d.mu.Lock()
			d.mu.err = err
			if err == nil {
				d.mu.fullyLocal = time.Since(d.start)
			}
			d.mu.Unlock()
			if err != nil {
				if recovery.IsBroken(err) {
					d.MarkFailed(err)
				}
				d.log.Error("online restore: the download failed; stopping the job (a restart restores again)", "checkpoint", d.res.ID, "err", err)
				e.Fail(fmt.Errorf("online restore of checkpoint %d: %w", d.res.ID, err))
				return
			}
			d.removeHook()
			ClearFailure(d.data, d.log)
			// Only what the download read and checked is verified; a file
			// the state deleted before the download reached it was never
			// read, and goes back to the scrub's care.
			done := d.res.Remote.Completed()
			var verified, unread []checkpoint.Object
			for _, o := range d.res.RemoteObjects {
				if done[o.Path] {
					verified = append(verified, o)
				} else {
					unread = append(unread, o)
				}
			}
			if d.Verified != nil {
				d.Verified(verified)
			}
			if d.Unread != nil && len(unread) > 0 {
				d.Unread(unread)
			}
			_, total := d.res.Remote.Total()
			d.log.Info("online restore: the state is fully local", "checkpoint", d.res.ID, "after", time.Since(d.start).Round(time.Millisecond),
				"bytes_downloaded", d.res.Remote.Downloaded(), "bytes_remote_at_start", total, "keys_prefetched", state.Prefetched(), "miss_cost", state.MissCost().Round(time.Microsecond))
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := d.lease.Release(rctx); err != nil {
				d.log.Warn("online restore: release the lease (it expires by itself)", "err", err)
			}
			cancel()
			return
		}
	}
}

// Status returns the bytes still remote and, once the download ended, the
// time it took.
func (d *Download) Status() (remote int64, fullyLocal time.Duration) {
	_, remote = d.res.Remote.Remaining()
	d.mu.Lock()
	defer d.mu.Unlock()
	return remote, d.mu.fullyLocal
}

// Close releases the lease (if still held) and the remote files' handles.
func (d *Download) Close() {
	d.removeHook()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = d.lease.Release(ctx) // a second release does nothing
	cancel()
	d.res.Remote.Close()
}

// Failure is the marker an online restore leaves in the data
// directory when its checkpoint's objects proved broken while it read them
// remotely (a checksum that does not match, a missing object, or a Pebble
// fatal error on a remote file). The next start restores that checkpoint by
// download, which verifies every file before the job runs and refuses a
// broken one by name (or falls back, with restore.fallback: previous), so
// a broken object is one clear failure, never a crash loop.
type Failure struct {
	Checkpoint uint64    `json:"checkpoint"`
	Reason     string    `json:"reason"`
	Time       time.Time `json:"time"`
}

func failurePath(data string) string { return filepath.Join(data, "online-restore-failed.json") }

// MarkFailed leaves the failure marker for cause in the data directory.
func (d *Download) MarkFailed(cause error) {
	b, _ := json.Marshal(Failure{Checkpoint: d.res.ID, Reason: cause.Error(), Time: time.Now().UTC()})
	if err := datadir.WriteFileAtomic(failurePath(d.data), b); err != nil {
		d.log.Error("online restore: record the failure (a restart may try online again)", "err", err)
	}
}

// ReadFailure returns the marker of a failed online restore (nil:
// none, or unreadable — then it is removed and ignored).
func ReadFailure(data string, log *slog.Logger) *Failure {
	b, err := os.ReadFile(failurePath(data))
	if err != nil {
		return nil
	}
	var f Failure
	if err := json.Unmarshal(b, &f); err != nil {
		log.Warn("online restore: an unreadable failure marker; ignored", "path", failurePath(data), "err", err)
		ClearFailure(data, log)
		return nil
	}
	return &f
}

// ClearFailure removes the failure marker: the restore was verified whole.
func ClearFailure(data string, log *slog.Logger) {
	if err := os.Remove(failurePath(data)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.Warn("online restore: remove the failure marker", "err", err)
	}
}

func rateText(n int64) string {
	if n <= 0 {
		return "unbounded"
	}
	return fmt.Sprintf("%.1f MiB/s", float64(n)/(1<<20))
}

// sanitizeHolder keeps a lease holder name to [A-Za-z0-9._-].
func sanitizeHolder(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b)
}

// Result is the restore whose objects this downloads.
func (d *Download) Result() *recovery.Result { return d.res }

// Rate is the download's bandwidth bound in bytes per second (0: none).
func (d *Download) Rate() int64 { return d.rate }
