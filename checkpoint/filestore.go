package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"cairn/internal/base/datadir"
	"cairn/internal/base/sysfile"
)

// tmpPrefix starts the base name of a file store's temporary files. They are
// listed like any object, so the orphan sweep removes those a crash left.
const tmpPrefix = ".tmp-"

// SyncError is an fsync (or close after write) failure of the file store. It
// is never retried: after a failed fsync the kernel may have dropped the
// dirty pages, so a retry could report success for lost data.
type SyncError = datadir.SyncError

// fileStore is a Store on a local directory, with the durability rules of
// docs/DESIGN.md ("The manifest and its commit rules"): temp file, fsync,
// rename (or link for Create), fsync directory.
type fileStore struct {
	root string
}

var _ Store = (*fileStore)(nil)

// NewFileStore returns a store rooted at the directory root, creating it when
// create is true.
func NewFileStore(root string, create bool) (Store, error) {
	root = filepath.Clean(root)
	if create {
		if err := mkdirAllSync(root); err != nil {
			return nil, fmt.Errorf("checkpoint: file store %s: %w", root, err)
		}
	}
	st, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: file store %s: %w (add ?create_dir=true to create it)", root, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("checkpoint: file store %s: not a directory", root)
	}
	return &fileStore{root: root}, nil
}

func openFileStore(u *url.URL) (Store, error) {
	dir, err := FileStorePath(u)
	if err != nil {
		return nil, err
	}
	for k := range u.Query() {
		if k != "create_dir" {
			return nil, fmt.Errorf("checkpoint: file store URL %q: unknown option %q", u.String(), k)
		}
	}
	create := u.Query().Get("create_dir")
	return NewFileStore(dir, create == "true" || create == "1")
}

// FileStoreURL returns the file:// URL of a store in the directory dir
// (made absolute), with ?create_dir=true when createDir. The path is
// escaped, so that every directory comes back from OpenStore as itself:
// one with a space, '#', '?' or '%' in its name (pasted after "file://",
// a '#' or '?' cut the path short and a '%' did not parse), and on
// Windows a drive letter or a share (file:///C:/dir, file:////host/share).
func FileStoreURL(dir string, createDir bool) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("checkpoint: file store %s: %w", dir, err)
	}
	return fileURL(filepath.ToSlash(abs), createDir), nil
}

// fileURL is FileStoreURL for an absolute slash-separated path: "/abs",
// or on Windows "C:/abs" or "//host/share".
func fileURL(p string, createDir bool) string {
	if !strings.HasPrefix(p, "/") {
		p = "/" + p // a drive letter: file:///C:/abs
	}
	u := url.URL{Scheme: "file", Path: p}
	if createDir {
		u.RawQuery = "create_dir=true"
	}
	return u.String()
}

// FileStorePath returns the local directory a file:// store URL names.
func FileStorePath(u *url.URL) (string, error) {
	p, err := fileURLPath(u, runtime.GOOS == "windows")
	if err != nil {
		return "", err
	}
	return filepath.FromSlash(p), nil
}

// fileURLPath is FileStorePath before the separators are the system's:
// on Windows "/C:/dir" is C:/dir, and file://host/share a share
// (//host/share); elsewhere the path is the URL's path, and a host other
// than localhost is refused.
func fileURLPath(u *url.URL, windows bool) (string, error) {
	p := u.Path
	if u.Host != "" && u.Host != "localhost" {
		if !windows {
			return "", fmt.Errorf("checkpoint: file store URL %q: host %q not supported (use file:///abs/path)", u.String(), u.Host)
		}
		p = "//" + u.Host + p
	}
	if p == "" {
		return "", fmt.Errorf("checkpoint: file store URL %q: empty path", u.String())
	}
	if windows && len(p) >= 3 && p[0] == '/' && isDriveLetter(p[1]) && p[2] == ':' {
		p = p[1:]
	}
	return p, nil
}

func isDriveLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func (s *fileStore) path(name string) (string, error) {
	if err := validName(name); err != nil {
		return "", err
	}
	return filepath.Join(s.root, filepath.FromSlash(name)), nil
}

// SyncDir fsyncs a directory so that the entries created or renamed in it
// survive a crash. A failure is a *SyncError: fatal, never retried.
func SyncDir(dir string) error { return datadir.SyncDir(dir) }

// mkdirAllSync creates dir and its missing parents, fsyncing the parent of
// every directory it creates so the new entries survive a crash.
func mkdirAllSync(dir string) error {
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("%s: not a directory", dir)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirAllSync(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return SyncDir(parent)
}

// createTemp creates a new temporary file next to final.
func createTemp(final string) (tmp string, f *os.File, err error) {
	dir := filepath.Dir(final)
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp = filepath.Join(dir, tmpPrefix+filepath.Base(final)+"-"+hex.EncodeToString(rnd[:]))
	for attempt := 0; ; attempt++ {
		if err := mkdirAllSync(dir); err != nil {
			return "", nil, err
		}
		f, err = os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		// A concurrent Delete may remove the (empty) directory between
		// mkdir and create; try again.
		if err != nil && errors.Is(err, fs.ErrNotExist) && attempt < 3 {
			continue
		}
		break
	}
	if err != nil {
		return "", nil, err
	}
	return tmp, f, nil
}

// syncClose fsyncs and closes a temporary file written in full.
func syncClose(tmp string, f *os.File) error {
	if err := f.Sync(); err != nil {
		f.Close()
		return &SyncError{Path: tmp, Err: err}
	}
	if err := f.Close(); err != nil {
		return &SyncError{Path: tmp, Err: err}
	}
	return nil
}

// writeTemp writes r to a new temporary file next to final and fsyncs it.
func writeTemp(final string, r io.Reader) (tmp string, err error) {
	tmp, f, err := createTemp(final)
	if err != nil {
		return "", err
	}
	if _, err = io.Copy(f, r); err != nil {
		f.Close()
		os.Remove(tmp)
		return "", err
	}
	if err = syncClose(tmp, f); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// create starts the object name as a stream (streamStore): it is written
// to a temporary file next to it, which Commit fsyncs and renames, as Put
// does.
func (s *fileStore) create(ctx context.Context, name string) (objectWriter, error) {
	p, err := s.path(name)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	tmp, f, err := createTemp(p)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: put %s: %w", name, err)
	}
	return &fileObject{name: name, final: p, tmp: tmp, f: f}, nil
}

// fileObject is an object of the file store being written.
type fileObject struct {
	name, final, tmp string
	f                *os.File
}

func (o *fileObject) Write(p []byte) (int, error) {
	n, err := o.f.Write(p)
	if err != nil {
		err = fmt.Errorf("checkpoint: put %s: %w", o.name, err)
	}
	return n, err
}

func (o *fileObject) Commit() error {
	if err := syncClose(o.tmp, o.f); err != nil {
		os.Remove(o.tmp)
		return fmt.Errorf("checkpoint: put %s: %w", o.name, err)
	}
	if err := os.Rename(o.tmp, o.final); err != nil {
		os.Remove(o.tmp)
		return fmt.Errorf("checkpoint: put %s: %w", o.name, err)
	}
	if err := SyncDir(filepath.Dir(o.final)); err != nil {
		return fmt.Errorf("checkpoint: put %s: %w", o.name, err)
	}
	return nil
}

func (o *fileObject) Abort() {
	o.f.Close()
	os.Remove(o.tmp)
}

func (s *fileStore) Put(ctx context.Context, name string, r io.Reader) error {
	p, err := s.path(name)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tmp, err := writeTemp(p, r)
	if err != nil {
		return fmt.Errorf("checkpoint: put %s: %w", name, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("checkpoint: put %s: %w", name, err)
	}
	if err := SyncDir(filepath.Dir(p)); err != nil {
		return fmt.Errorf("checkpoint: put %s: %w", name, err)
	}
	return nil
}

// Create links a fully written and fsynced temp file to the final name:
// link(2) fails with EEXIST instead of replacing, so the create is atomic
// (on a file system without hard links, a rename that refuses to replace:
// sysfile.CreateNoReplace).
func (s *fileStore) Create(ctx context.Context, name string, data []byte) error {
	p, err := s.path(name)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tmp, err := writeTemp(p, strings.NewReader(string(data)))
	if err != nil {
		return fmt.Errorf("checkpoint: create %s: %w", name, err)
	}
	defer os.Remove(tmp)
	if err := sysfile.CreateNoReplace(tmp, p); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("checkpoint: create %s: %w", name, ErrExists)
		}
		return fmt.Errorf("checkpoint: create %s: %w", name, err)
	}
	// The link's second name goes before the directory's fsync, which
	// then makes its removal durable too. A failed removal does not undo
	// the commit: the orphan sweep removes the temp name.
	_ = os.Remove(tmp)
	if err := SyncDir(filepath.Dir(p)); err != nil {
		return fmt.Errorf("checkpoint: create %s: %w", name, err)
	}
	return nil
}

func (s *fileStore) open(name string) (*os.File, os.FileInfo, error) {
	p, err := s.path(name)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, fmt.Errorf("checkpoint: get %s: %w", name, ErrNotFound)
		}
		return nil, nil, fmt.Errorf("checkpoint: get %s: %w", name, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("checkpoint: get %s: %w", name, err)
	}
	if st.IsDir() {
		f.Close()
		return nil, nil, fmt.Errorf("checkpoint: get %s: %w", name, ErrNotFound)
	}
	return f, st, nil
}

func (s *fileStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	f, _, err := s.open(name)
	if err != nil {
		return nil, err
	}
	return f, nil
}

type sectionReadCloser struct {
	*io.SectionReader
	io.Closer
}

func (s *fileStore) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	f, st, err := s.open(name)
	if err != nil {
		return nil, err
	}
	if offset < 0 || offset > st.Size() {
		f.Close()
		return nil, fmt.Errorf("checkpoint: get %s: range offset %d outside size %d", name, offset, st.Size())
	}
	if length < 0 || offset+length > st.Size() {
		length = st.Size() - offset
	}
	return sectionReadCloser{io.NewSectionReader(f, offset, length), f}, nil
}

func (s *fileStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	// Walk the deepest directory that contains every match.
	dir := prefix
	if !strings.HasSuffix(dir, "/") {
		dir = path.Dir(dir)
	}
	dir = strings.TrimSuffix(dir, "/")
	start := s.root
	if dir != "" && dir != "." {
		if err := validName(dir); err != nil {
			return err
		}
		start = filepath.Join(s.root, filepath.FromSlash(dir))
	}
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // vanished during the walk, or the prefix has no directory
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		if !strings.HasPrefix(name, prefix) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		return fn(ObjectInfo{Name: name, Size: info.Size(), ModTime: info.ModTime()})
	})
	if err != nil {
		return fmt.Errorf("checkpoint: list %q: %w", prefix, err)
	}
	return nil
}

func (s *fileStore) Delete(ctx context.Context, name string) error {
	p, err := s.path(name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint: delete %s: %w", name, err)
	}
	// Remove directories left empty, up to the root; a non-empty one stops it.
	for dir := filepath.Dir(p); dir != s.root && strings.HasPrefix(dir, s.root); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break
		}
	}
	return nil
}

func (s *fileStore) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	p, err := s.path(name)
	if err != nil {
		return ObjectInfo{}, err
	}
	st, err := os.Stat(p)
	if err != nil || st.IsDir() {
		if err == nil || errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return ObjectInfo{}, fmt.Errorf("checkpoint: stat %s: %w", name, ErrNotFound)
		}
		return ObjectInfo{}, fmt.Errorf("checkpoint: stat %s: %w", name, err)
	}
	return ObjectInfo{Name: name, Size: st.Size(), ModTime: st.ModTime()}, nil
}

func (s *fileStore) Close(ctx context.Context) error { return nil }
