package state

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"cairn/internal/base/sysfile"
)

// Remote files: the SSTs of an online restore (docs/RATIONALE.md, "Online
// restore").
//
// An online restore places each SST of the checkpoint that is not already
// on local disk as a sparse file of its final size, under its final name,
// and registers it here. A slot's DB opens at once on these files: its
// vfs.FS (remoteFS below) serves a read of a registered file by first
// fetching the chunks the read touches from the checkpoint store (one
// ranged GET per run of missing chunks) and writing them into the sparse
// file, so a chunk is fetched at most once and every later read of it is a
// local read. RemoteSet.Download meanwhile fetches every missing chunk at a
// bounded rate; a file whose chunks are all present is fsynced, its
// SHA-256 checked against the manifest's, and from then on it is an
// ordinary local file.
//
// Files are known by their (device, inode), not by path: the restore
// builds the state in a staging folder and renames it into place, and a
// checkpoint of the DB hard-links the SSTs (same inode) into its local
// copy. Until a file is complete, its sparse regions read as zeros through
// any other path: every reader outside the DB's FS goes through EnsureLocal
// or RemoteSum first (the checkpoint writer's hashing and uploads), and the
// local checkpoint's trust index leaves incomplete files out
// (RemoteIncomplete), so a restart hashes them and finds them wrong rather
// than trusting zeros. Blocks read before a file is complete are checked by
// Pebble's per-block checksums; the whole file by its SHA-256 once complete.
//
// The live state directory is never reused across restarts (every start
// restores into a fresh one), so nothing about a remote file is persisted.

// RemoteChunk is the unit in which remote files are fetched and tracked:
// what a read of a block not yet local fetches (Pebble's blocks are 4 KiB).
// 64 KiB before: a read paid 16 times its block on a slow link. 4 KiB was
// measured too: 2x more reads during the download than 16 KiB, but the
// download took 20-50% longer from an S3 server
// (docs/bench/online-restore.md, "Smaller chunks").
const RemoteChunk = 16 << 10

// downloadRun is the largest run of chunks RemoteSet.Download fetches in one
// request (1 MiB): small enough that a read waiting behind one on a shared
// link waits little.
const downloadRun = (1 << 20) / RemoteChunk

// foreground counts the DB reads fetching remote chunks right now; the
// background download yields to them (up to downloadYield per run), so a
// job's reads do not queue behind the download on a shared link.
var foreground atomic.Int64

const downloadYield = 20 * time.Millisecond

// RemoteObject is the store object holding a remote file's content.
type RemoteObject struct {
	// Name is the object's store path (named in errors and leases).
	Name   string
	Size   int64
	SHA256 string
	// Fetch opens n bytes of the object from off.
	Fetch func(ctx context.Context, off, n int64) (io.ReadCloser, error)
	// Corrupt builds the error reported when the object's content does not
	// match Size or SHA256 (a typed error of the caller's package).
	Corrupt func(reason string) error
}

type fileID struct{ dev, ino uint64 }

func idOf(fi os.FileInfo) (fileID, bool) {
	dev, ino, ok := sysfile.ID(fi)
	return fileID{dev, ino}, ok
}

// remotes is the process's registry of remote files by identity.
var remotes struct {
	sync.Mutex
	byID map[fileID]*remoteFile
}

// outstanding counts the registered remote files not yet complete, dropped
// or closed: while it is not zero, compactions wait (scheduler.go).
var outstanding atomic.Int64

// registered counts the registry's entries: while it is zero (no online
// restore in this process) remoteFS adds no stat to the DB's opens and
// removes.
var registered atomic.Int64

// remoteOutstanding reports whether some remote file is still incomplete.
func remoteOutstanding() bool { return outstanding.Load() > 0 }

func lookupRemote(fi os.FileInfo) *remoteFile {
	if registered.Load() == 0 {
		return nil
	}
	id, ok := idOf(fi)
	if !ok {
		return nil
	}
	remotes.Lock()
	defer remotes.Unlock()
	return remotes.byID[id]
}

func lookupRemotePath(path string) *remoteFile {
	if registered.Load() == 0 {
		return nil // no stat per file of every checkpoint when nothing is remote
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	return lookupRemote(fi)
}

// RemoteSum returns the SHA-256 a registered remote file will have (known
// from the manifest, whether or not it is complete yet), so hashing it
// needs no read.
func RemoteSum(fi os.FileInfo) (string, bool) {
	if r := lookupRemote(fi); r != nil && r.obj.Size == fi.Size() {
		return r.obj.SHA256, true
	}
	return "", false
}

// RemoteIncomplete reports whether the file at path is a remote file not yet
// complete: its content is not what it will be.
func RemoteIncomplete(path string) bool {
	r := lookupRemotePath(path)
	return r != nil && !r.complete.Load()
}

// EnsureLocal makes a remote file at path complete (fetching what it
// misses and checking its SHA-256) before it is read outside the DB; any
// other file is left alone.
func EnsureLocal(ctx context.Context, path string) error {
	r := lookupRemotePath(path)
	if r == nil || r.complete.Load() {
		return nil
	}
	if err := r.fill(ctx, 0, r.obj.Size, nil); err != nil {
		return err
	}
	return r.finish()
}

// remoteFile is one registered remote file.
type remoteFile struct {
	obj RemoteObject
	id  fileID
	// f is a read-write handle of the sparse file, kept open for fills (the
	// path may be renamed or linked meanwhile).
	f      *os.File
	chunks int

	mu      sync.Mutex
	have    []bool
	missing int
	// inflight is the chunks a read (not the background download) is
	// fetching right now, each with a channel closed when that fetch ends:
	// another read of the chunk waits for it instead of fetching it again,
	// which concurrent reads of one batch's keys (DB.Prefetch) would do
	// for keys in the same chunk.
	inflight map[int]chan struct{}
	// verified is set (under mu) once the SHA-256 check ran; err is its
	// outcome.
	verified bool
	err      error

	complete atomic.Bool
	// dropped is set when the DB deleted the file: nobody needs it.
	dropped atomic.Bool
	// settled is set once the file stopped counting in outstanding.
	settled atomic.Bool
}

// settle takes the file out of the outstanding count (once).
func (r *remoteFile) settle() {
	if !r.settled.Swap(true) {
		outstanding.Add(-1)
	}
}

func (r *remoteFile) chunkSpan(off, n int64) (int, int) {
	if n <= 0 {
		return 0, 0
	}
	end := min(off+n, r.obj.Size)
	return int(off / RemoteChunk), int((end + RemoteChunk - 1) / RemoteChunk)
}

// missingBytes is the bytes of the chunks not fetched yet (r.mu held):
// every missing chunk is whole but the last, which holds the file's tail.
func (r *remoteFile) missingBytes() int64 {
	n := int64(r.missing) * RemoteChunk
	if r.chunks > 0 && !r.have[r.chunks-1] {
		n -= int64(r.chunks)*RemoteChunk - r.obj.Size
	}
	return n
}

// missingRun returns the first run of missing chunks in [a, b), at most
// limit long (b0 == a0 when none is missing).
func (r *remoteFile) missingRun(a, b, limit int) (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for a < b && r.have[a] {
		a++
	}
	e := a
	for e < b && !r.have[e] && e-a < limit {
		e++
	}
	return a, e
}

// fill fetches the missing chunks among those covering [off, off+n), in
// runs of up to downloadRun chunks; paced, when set, is called with each
// run's byte count after it is written.
func (r *remoteFile) fill(ctx context.Context, off, n int64, paced func(int64) error) error {
	a, b := r.chunkSpan(off, n)
	for a < b {
		s, e := r.missingRun(a, b, downloadRun)
		if s == e {
			return nil
		}
		if paced == nil {
			var wait chan struct{}
			if e, wait = r.claim(s, e); wait != nil {
				select {
				case <-wait: // fetched by another read (or failed: look again)
				case <-ctx.Done():
					return fmt.Errorf("state: remote %s: %w", r.obj.Name, ctx.Err())
				}
				continue
			}
			t := time.Now()
			err := r.fetchRun(ctx, s, e, false)
			r.unclaim(s, e)
			if err != nil {
				return err
			}
			if e-s <= readChunks && prefetching.Load() == 0 {
				observeLoneFetch(time.Since(t))
			}
			a = e
			continue
		}
		if err := r.fetchRun(ctx, s, e, true); err != nil {
			return err
		}
		if paced != nil {
			if err := paced(min(int64(e)*RemoteChunk, r.obj.Size) - int64(s)*RemoteChunk); err != nil {
				return err
			}
		}
		a = e
	}
	return nil
}

// claim marks the missing chunks [s, e') as fetched by the calling read,
// e' <= e stopping at the first chunk another read is fetching, and returns
// e'; when chunk s itself is being fetched it claims nothing and returns the
// channel to wait on.
func (r *remoteFile) claim(s, e int) (int, chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.inflight[s]; ok {
		return s, w
	}
	if r.have[s] { // fetched since missingRun looked
		return s, closedChan
	}
	if r.inflight == nil {
		r.inflight = map[int]chan struct{}{}
	}
	done := make(chan struct{})
	c := s
	for ; c < e; c++ {
		if _, ok := r.inflight[c]; ok {
			break
		}
		r.inflight[c] = done
	}
	return c, nil
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// unclaim ends the calling read's fetch of chunks [s, e), waking the reads
// waiting for them.
func (r *remoteFile) unclaim(s, e int) {
	r.mu.Lock()
	done := r.inflight[s]
	for c := s; c < e; c++ {
		delete(r.inflight, c)
	}
	r.mu.Unlock()
	close(done)
}

// fetchRun fetches chunks [s, e) with one ranged read and writes them into
// the file. Two readers may fetch the same chunk at once; both write the
// same bytes, and a chunk is marked present only after it is written.
//
// The background download (background) yields to the DB's reads: before
// its request and before each chunk of the response it waits while a read
// is fetching (at most downloadYield each time, so it always progresses),
// so that on a shared link a read's fetch queues behind at most one chunk
// per download worker.
func (r *remoteFile) fetchRun(ctx context.Context, s, e int, background bool) error {
	yield := func() {
		for t := time.Now(); background && foreground.Load() > 0 && time.Since(t) < downloadYield; {
			time.Sleep(200 * time.Microsecond)
		}
	}
	off := int64(s) * RemoteChunk
	n := min(int64(e)*RemoteChunk, r.obj.Size) - off
	yield()
	rc, err := r.obj.Fetch(ctx, off, n)
	if err != nil {
		return fmt.Errorf("state: remote %s [%d,+%d): %w", r.obj.Name, off, n, err)
	}
	defer rc.Close()
	buf := make([]byte, n)
	var err2 error
	for p := int64(0); p < n && err2 == nil; p += RemoteChunk {
		yield()
		_, err2 = io.ReadFull(rc, buf[p:min(p+RemoteChunk, n)])
	}
	if err := err2; err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return r.obj.Corrupt(fmt.Sprintf("shorter than the manifest's %d bytes (range [%d,+%d))", r.obj.Size, off, n))
		}
		return fmt.Errorf("state: remote %s [%d,+%d): %w", r.obj.Name, off, n, err)
	}
	if _, err := r.f.WriteAt(buf, off); err != nil {
		return fmt.Errorf("state: remote %s: write %s: %w", r.obj.Name, r.f.Name(), err)
	}
	r.mu.Lock()
	for c := s; c < e; c++ {
		if !r.have[c] {
			r.have[c] = true
			r.missing--
		}
	}
	r.mu.Unlock()
	return nil
}

// finish checks a fully fetched file once: fsync, then its SHA-256 against
// the manifest's. A mismatch is the object's Corrupt error, reported to
// every caller.
func (r *remoteFile) finish() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.verified {
		return r.err
	}
	if r.missing > 0 {
		return fmt.Errorf("state: remote %s: %d chunks still missing", r.obj.Name, r.missing)
	}
	r.verified = true
	if err := r.f.Sync(); err != nil {
		r.err = fmt.Errorf("state: remote %s: fsync: %w", r.obj.Name, err)
		return r.err
	}
	h := sha256.New()
	n, err := io.Copy(h, io.NewSectionReader(r.f, 0, r.obj.Size+1))
	switch {
	case err != nil:
		r.err = fmt.Errorf("state: remote %s: verify: %w", r.obj.Name, err)
	case n != r.obj.Size:
		r.err = r.obj.Corrupt(fmt.Sprintf("size %d, manifest says %d", n, r.obj.Size))
	case hex.EncodeToString(h.Sum(nil)) != r.obj.SHA256:
		r.err = r.obj.Corrupt("sha256 " + hex.EncodeToString(h.Sum(nil)) + ", manifest says " + r.obj.SHA256)
	default:
		r.complete.Store(true)
		r.settle()
	}
	return r.err
}

// remoteTimeout bounds one on-demand fetch of a read (the store's retries
// happen inside it).
const remoteTimeout = 2 * time.Minute

// readAt serves a DB read of the file: missing chunks first.
func (r *remoteFile) ensure(off, n int64) error {
	if r.complete.Load() {
		return nil
	}
	foreground.Add(1)
	defer foreground.Add(-1)
	ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
	defer cancel()
	return r.fill(ctx, off, n, nil)
}

// RemoteSet is the remote files of one online restore.
type RemoteSet struct {
	mu    sync.Mutex
	files []*remoteFile
	// downloaded counts the bytes fetched by Download (not by reads).
	downloaded atomic.Int64
}

// NewRemoteSet returns an empty set.
func NewRemoteSet() *RemoteSet { return &RemoteSet{} }

// Add creates path as a sparse file of o.Size bytes (path must not exist)
// and registers it as remote, fetched from o.
func (s *RemoteSet) Add(path string, o RemoteObject) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("state: remote %s: %w", o.Name, err)
	}
	if err := f.Truncate(o.Size); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("state: remote %s: %w", o.Name, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("state: remote %s: %w", o.Name, err)
	}
	id, ok := idOf(fi)
	if !ok {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("state: remote %s: no file identity on this system", o.Name)
	}
	chunks := int((o.Size + RemoteChunk - 1) / RemoteChunk)
	r := &remoteFile{obj: o, id: id, f: f, chunks: chunks, have: make([]bool, chunks), missing: chunks}
	remotes.Lock()
	if remotes.byID == nil {
		remotes.byID = map[fileID]*remoteFile{}
	}
	remotes.byID[id] = r
	remotes.Unlock()
	registered.Add(1)
	outstanding.Add(1)
	s.mu.Lock()
	s.files = append(s.files, r)
	s.mu.Unlock()
	return nil
}

// Remaining returns the files not yet complete and the bytes they miss.
func (s *RemoteSet) Remaining() (files int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.files {
		if r.complete.Load() || r.dropped.Load() {
			continue
		}
		files++
		r.mu.Lock()
		bytes += r.missingBytes()
		r.mu.Unlock()
	}
	return files, bytes
}

// Objects returns the store paths of the files not yet complete (what a
// lease must hold).
func (s *RemoteSet) Objects() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.files {
		if !r.complete.Load() && !r.dropped.Load() {
			out = append(out, r.obj.Name)
		}
	}
	sort.Strings(out)
	return out
}

// Total returns the set's file count and byte size.
func (s *RemoteSet) Total() (files int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.files {
		bytes += r.obj.Size
	}
	return len(s.files), bytes
}

// Completed returns the store paths of the files fetched whole and
// verified against their SHA-256. A file the DB deleted before the
// download reached it is not among them: nobody read it.
func (s *RemoteSet) Completed() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for _, r := range s.files {
		if r.complete.Load() {
			out[r.obj.Name] = true
		}
	}
	return out
}

// Downloaded returns the bytes Download fetched so far.
func (s *RemoteSet) Downloaded() int64 { return s.downloaded.Load() }

// Download fetches every missing chunk of the set's files, concurrency
// files at a time, at most bytesPerSec in total (0: unbounded), and checks
// each file's SHA-256 once it is complete. Files the DB deleted meanwhile
// are skipped. It returns when every file is complete (nil), on the first
// error (a corrupt object is its Corrupt error), or when ctx is done.
func (s *RemoteSet) Download(ctx context.Context, bytesPerSec int64, concurrency int) error {
	s.mu.Lock()
	files := append([]*remoteFile(nil), s.files...)
	s.mu.Unlock()
	// Smallest first. An LSM's recent writes are in its small files (L0
	// flushes, small compaction outputs), and a restarted job replays
	// recent input, which reads recently written keys: made local first,
	// they stop costing a round trip per block while the large, old
	// bottom-level files still download. (In the order the restore added
	// them, a bulk-loaded state's large files came first, and the replay
	// waited on misses until nearly the end.) Smaller files also complete
	// more files per byte. The total time is the same bytes either way.
	sort.SliceStable(files, func(i, j int) bool { return files[i].obj.Size < files[j].obj.Size })
	concurrency = max(concurrency, 1)
	start := time.Now()
	var paced atomic.Int64
	pace := func(n int64) error {
		s.downloaded.Add(n)
		if bytesPerSec <= 0 {
			return ctx.Err()
		}
		due := start.Add(time.Duration(float64(paced.Add(n)) / float64(bytesPerSec) * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
		return ctx.Err()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(files) || ctx.Err() != nil {
					return
				}
				r := files[i]
				if r.complete.Load() || r.dropIfUnlinked() {
					continue
				}
				err := r.fill(ctx, 0, r.obj.Size, pace)
				if err == nil && !r.dropped.Load() {
					err = r.finish()
				}
				if err != nil && !r.dropped.Load() {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// Close unregisters the set's files and closes their handles; the files
// stay on disk as they are (a restart restores afresh).
func (s *RemoteSet) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	remotes.Lock()
	for _, r := range s.files {
		if remotes.byID[r.id] == r {
			delete(remotes.byID, r.id)
			registered.Add(-1)
		}
		r.settle()
		r.f.Close()
	}
	remotes.Unlock()
	s.files = nil
}

// remoteFS serves the DB's reads of remote files (see the top of this file)
// and notes the ones it deletes.
type remoteFS struct{ vfs.FS }

func (fs remoteFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil || registered.Load() == 0 || !isSSTName(name) {
		return f, err
	}
	fi, err := os.Stat(name)
	if err != nil {
		return f, nil
	}
	if r := lookupRemote(fi); r != nil && !r.complete.Load() {
		return &remoteVFSFile{File: f, r: r}, nil
	}
	return f, nil
}

// Remove marks a remote file dropped once its last link is gone: an
// obsolete SST of this DB that no other slot (a scale-up shares the old
// slot's files) and no local checkpoint copy links.
func (fs remoteFS) Remove(name string) error {
	var r *remoteFile
	if registered.Load() > 0 && isSSTName(name) {
		if fi, err := os.Stat(name); err == nil {
			r = lookupRemote(fi)
		}
	}
	if err := fs.FS.Remove(name); err != nil {
		return err
	}
	if r != nil {
		r.dropIfUnlinked()
	}
	return nil
}

// dropIfUnlinked marks the file dropped when no path links it any more.
func (r *remoteFile) dropIfUnlinked() bool {
	if fi, err := r.f.Stat(); err == nil {
		if n, ok := sysfile.Links(fi); ok && n == 0 {
			r.dropped.Store(true)
			r.settle()
		}
	}
	return r.dropped.Load()
}

// Unwrap implements vfs's wrapping-FS convention.
func (fs remoteFS) Unwrap() vfs.FS { return fs.FS }

func isSSTName(name string) bool { return strings.HasSuffix(name, ".sst") }

// remoteVFSFile is a DB's read handle of a remote file.
type remoteVFSFile struct {
	vfs.File
	r   *remoteFile
	pos int64
}

func (f *remoteVFSFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.r.ensure(off, int64(len(p))); err != nil {
		return 0, err
	}
	return f.File.ReadAt(p, off)
}

func (f *remoteVFSFile) Read(p []byte) (int, error) {
	n, err := f.ReadAt(p, f.pos)
	f.pos += int64(n)
	return n, err
}
