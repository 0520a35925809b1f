package recovery

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
	"cairn/state"
)

// counters are a restore's byte and file figures, updated concurrently.
type counters struct {
	bytesLocal, bytesCache, bytesDownloaded atomic.Int64
	filesLocal, filesCache, filesDownloaded atomic.Int64
	// bytesRemote and filesRemote are an online restore's files left in
	// the store, read remotely and downloaded after the restore.
	bytesRemote, filesRemote atomic.Int64
	// bytesDone and filesDone drive progress reporting.
	bytesDone, filesDone atomic.Int64

	// read lists the shared objects downloaded from the store and checked;
	// remote those left in the store (online).
	mu         sync.Mutex
	read       []checkpoint.Object
	remoteObjs []checkpoint.Object
}

func (c *counters) note(list *[]checkpoint.Object, o checkpoint.Object) {
	if o.Kind != checkpoint.KindSST {
		return
	}
	c.mu.Lock()
	*list = append(*list, o)
	c.mu.Unlock()
}

// fetcher places verified copies of a manifest's objects on local disk,
// preferring (in order) the node's local checkpoint, the standby cache and
// the store.
type fetcher struct {
	store checkpoint.Store
	job   string
	// localDir is <LocalDir>/chk-<id> ("" when local recovery does not
	// apply); localIdx its trust index.
	localDir string
	localIdx *checkpoint.TrustIndex
	// cacheDir is the standby cache ("" for none); cacheIdx its trust index.
	cacheDir string
	cacheIdx *checkpoint.TrustIndex
	c        *counters
}

// newFetcher is the fetcher of a restore of m: local recovery applies to an
// incremental checkpoint (not a savepoint) whose local copy is in
// o.LocalDir; a standby cache to anything.
func newFetcher(m *checkpoint.Manifest, o *Options, c *counters) *fetcher {
	f := &fetcher{store: o.Store, job: m.Job, c: c}
	if o.LocalDir != "" && m.Mode == checkpoint.ModeIncremental && checkpoint.SavepointName(m) == "" {
		f.localDir = datadir.Checkpoint(o.LocalDir, m.ID)
		f.localIdx = checkpoint.ReadTrustIndex(filepath.Join(f.localDir, checkpoint.LocalIndexName))
	}
	if o.CacheDir != "" {
		f.cacheDir = o.CacheDir
		f.cacheIdx = checkpoint.ReadTrustIndex(filepath.Join(o.CacheDir, CacheIndexName))
	}
	return f
}

// source of a candidate local file.
type source int

const (
	fromLocal source = iota
	fromCache
)

// candidate returns a local file holding o's content, if one is known to
// match (by the trust index, else by hashing it).
func (f *fetcher) candidate(o checkpoint.Object, src source) (string, bool) {
	var dir, rel string
	var idx *checkpoint.TrustIndex
	switch src {
	case fromLocal:
		if f.localDir == "" || o.Kind == checkpoint.KindFullData || o.Kind == checkpoint.KindIndex {
			return "", false
		}
		dir, idx, rel = f.localDir, f.localIdx, datadir.SlotName(o.Slot)+"/"+o.File
	case fromCache:
		if f.cacheDir == "" {
			return "", false
		}
		dir, idx, rel = f.cacheDir, f.cacheIdx, cacheRel(f.job, o.Path)
	}
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if idx.Trusts(rel, p, o) {
		return p, true
	}
	fi, err := os.Stat(p)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != o.Size {
		return "", false
	}
	sum, n, err := checkpoint.HashFile(p)
	if err != nil || n != o.Size || sum != o.SHA256 {
		return "", false
	}
	return p, true
}

// cacheRel is an object's path inside a standby cache: its store path
// without the job prefix (shared SSTs by content, private files per
// checkpoint).
func cacheRel(job, objectPath string) string {
	return strings.TrimPrefix(objectPath, job+"/")
}

// fetch writes o's verified content to dst, which must not exist. With link,
// a local candidate is hard-linked (the result will only be read, or is an
// immutable SST); otherwise it is copied.
func (f *fetcher) fetch(ctx context.Context, o checkpoint.Object, dst string, link bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if f.placeLocal(o, dst, link) {
		return nil
	}
	if err := download(ctx, f.store, o, dst, &f.c.bytesDone); err != nil {
		return err
	}
	f.c.bytesDownloaded.Add(o.Size)
	f.c.filesDownloaded.Add(1)
	f.c.filesDone.Add(1)
	f.c.note(&f.c.read, o)
	return nil
}

// fetchOrRemote places o at dst from local disk when a verified copy is
// there, and otherwise registers dst in remote as a remote file read from
// the store (an online restore's SSTs).
func (f *fetcher) fetchOrRemote(ctx context.Context, o checkpoint.Object, dst string, remote *state.RemoteSet) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if f.placeLocal(o, dst, true) {
		return nil
	}
	if err := remote.Add(dst, remoteObject(f.store, o)); err != nil {
		return err
	}
	f.c.filesRemote.Add(1)
	f.c.bytesRemote.Add(o.Size)
	f.c.note(&f.c.remoteObjs, o)
	f.c.bytesDone.Add(o.Size)
	f.c.filesDone.Add(1)
	return nil
}

// remoteObject is o as a state.RemoteObject read from store.
func remoteObject(store checkpoint.Store, o checkpoint.Object) state.RemoteObject {
	return state.RemoteObject{
		Name: o.Path, Size: o.Size, SHA256: o.SHA256,
		Fetch: func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
			return store.GetRange(ctx, o.Path, off, n)
		},
		Corrupt: func(reason string) error {
			return fmt.Errorf("online restore: %w", &checkpoint.CorruptionError{Object: o.Path, Reason: reason})
		},
	}
}

// placeLocal places o at dst from the node's local checkpoint or the
// standby cache, when one holds a verified copy.
func (f *fetcher) placeLocal(o checkpoint.Object, dst string, link bool) bool {
	for _, src := range []source{fromLocal, fromCache} {
		p, ok := f.candidate(o, src)
		if !ok {
			continue
		}
		if err := place(p, dst, link); err != nil {
			// Gone meanwhile (a standby pruning its cache): try the next
			// source.
			os.Remove(dst)
			continue
		}
		if src == fromLocal {
			f.c.bytesLocal.Add(o.Size)
			f.c.filesLocal.Add(1)
		} else {
			f.c.bytesCache.Add(o.Size)
			f.c.filesCache.Add(1)
		}
		f.c.bytesDone.Add(o.Size)
		f.c.filesDone.Add(1)
		return true
	}
	return false
}

// download writes object o from the store to dst, fsyncs it and checks its
// size and SHA-256; progress is advanced by the bytes received. A mismatch
// is a *checkpoint.CorruptionError naming the object; a missing object wraps
// checkpoint.ErrNotFound.
func download(ctx context.Context, store checkpoint.Store, o checkpoint.Object, dst string, progress *atomic.Int64) (err error) {
	rc, err := store.Get(ctx, o.Path)
	if err != nil {
		return fmt.Errorf("download %s: %w", o.Path, err)
	}
	defer rc.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("download %s: %w", o.Path, err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("download %s: close %s: %w", o.Path, dst, cerr)
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	h := sha256.New()
	// Read at most one byte past the expected size: enough to notice a
	// longer object without copying an arbitrarily large one.
	n, err := io.Copy(&progressWriter{w: out, h: h, n: progress}, io.LimitReader(ctxReader{ctx, rc}, o.Size+1))
	if err != nil {
		return fmt.Errorf("download %s: %w", o.Path, err)
	}
	if n != o.Size {
		return fmt.Errorf("download: %w", &checkpoint.CorruptionError{Object: o.Path, Reason: fmt.Sprintf("size %d, manifest says %d", n, o.Size)})
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != o.SHA256 {
		return fmt.Errorf("download: %w", &checkpoint.CorruptionError{Object: o.Path, Reason: "sha256 " + sum + ", manifest says " + o.SHA256})
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("download %s: fsync %s: %w", o.Path, dst, err)
	}
	return nil
}

type progressWriter struct {
	w io.Writer
	h hash.Hash
	n *atomic.Int64
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.h.Write(b[:n])
	if p.n != nil {
		p.n.Add(int64(n))
	}
	return n, err
}

// ctxReader stops a long copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// place hard-links (link) or copies src to dst; a failed link (another
// filesystem) falls back to a copy.
func place(src, dst string, link bool) error {
	if link {
		if err := os.Link(src, dst); err == nil {
			return nil
		}
	}
	return copyFile(src, dst)
}

// copyFile copies src to a new file dst and fsyncs it.
func copyFile(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if _, err = io.Copy(out, in); err != nil {
		return err
	}
	return out.Sync()
}
