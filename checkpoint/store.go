package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// ErrNotFound is returned (wrapped) by a Store when an object does not exist.
var ErrNotFound = errors.New("checkpoint: object not found")

// ErrKeyGroupsMismatch: a job's key_groups differs from its checkpoints'.
// key_groups is part of the state's format and can never change.
var ErrKeyGroupsMismatch = errors.New("checkpoint: key_groups differs from the checkpoints'")

// ErrWrongJob is returned (wrapped) when a manifest belongs to another job.
var ErrWrongJob = errors.New("checkpoint: checkpoint belongs to another job")

// ErrExists is returned (wrapped) by Store.Create when the object already
// exists: a manifest is never overwritten.
var ErrExists = errors.New("checkpoint: object already exists")

// ErrStoreURL is a store URL cairn refuses to guess the meaning of.
var ErrStoreURL = errors.New("checkpoint: bad store URL")

// CorruptionError reports an object whose content does not match what a
// manifest or index says about it (missing, wrong size, wrong checksum,
// undecodable).
type CorruptionError struct {
	// Object is the store path of the object.
	Object string
	// Reason says what is wrong with it.
	Reason string
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("checkpoint: corrupt object %s: %s", e.Object, e.Reason)
}

// IsCorruption reports whether err is or wraps a *CorruptionError.
func IsCorruption(err error) bool {
	var c *CorruptionError
	return errors.As(err, &c)
}

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	// Name is the object's path relative to the store's base.
	Name string
	// Size is the object's length in bytes.
	Size int64
	// ModTime is the time the object was last written.
	ModTime time.Time
}

// Store is an object store holding checkpoints: a flat namespace of
// immutable objects named by slash-separated paths. Implementations are safe
// for concurrent use.
type Store interface {
	// Put writes the object name with the content of r, replacing any
	// object of that name. The object becomes visible whole or not at all.
	Put(ctx context.Context, name string, r io.Reader) error
	// Create writes the object name only if it does not exist; otherwise it
	// returns an error wrapping ErrExists. It is the manifest commit.
	Create(ctx context.Context, name string, data []byte) error
	// Get opens the object for reading; ErrNotFound when it does not exist.
	Get(ctx context.Context, name string) (io.ReadCloser, error)
	// GetRange opens length bytes of the object from offset (length < 0:
	// to the end).
	GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error)
	// List calls fn for every object whose name starts with prefix, in no
	// particular order.
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error
	// Delete removes the object; deleting a missing object is not an error.
	Delete(ctx context.Context, name string) error
	// Stat describes the object; ErrNotFound when it does not exist.
	Stat(ctx context.Context, name string) (ObjectInfo, error)
	// Close releases the store's resources.
	Close(ctx context.Context) error
}

// OpenStore opens a store by URL:
//
//	file:///abs/path[?create_dir=true]
//	s3://bucket[/prefix][?endpoint=http://127.0.0.1:9000&use_path_style=true&region=us-east-1]
//
// S3 credentials come from the standard AWS chain (environment, shared
// config, instance metadata). The returned store retries transient errors
// (see RetryStore).
func OpenStore(ctx context.Context, rawURL string) (Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: store URL %q: %w", rawURL, err)
	}
	if u.Fragment != "" || strings.HasSuffix(rawURL, "#") {
		// A '#' in a path starts a URL's fragment: the store would be
		// the directory before it, silently.
		return nil, fmt.Errorf("%w: store URL %q has a '#' (a URL fragment): write it as %%23 in a path, or choose a name without it", ErrStoreURL, rawURL)
	}
	var s Store
	switch u.Scheme {
	case "file":
		s, err = openFileStore(u)
	case "s3":
		s, err = openBlobStore(ctx, u)
	default:
		if looksLikePath(rawURL, u) {
			if fu, ferr := FileStoreURL(rawURL, false); ferr == nil {
				return nil, fmt.Errorf("checkpoint: store URL %q: a store is a URL, not a path: for that directory use %s", rawURL, fu)
			}
		}
		return nil, fmt.Errorf("checkpoint: store URL %q: unsupported scheme %q (use file:// or s3://)", rawURL, u.Scheme)
	}
	if err != nil {
		return nil, err
	}
	return NewRetryStore(s, RetryOptions{}), nil
}

// looksLikePath: rawURL has no scheme (a path), or on Windows its
// "scheme" is a drive letter (C:\dir parses as scheme "c").
func looksLikePath(rawURL string, u *url.URL) bool {
	return u.Scheme == "" || len(u.Scheme) == 1 && filepath.VolumeName(rawURL) != ""
}

// streamStore is a Store that also takes an object as a stream its caller
// writes: a full checkpoint encodes its data objects straight into it, with
// no local temporary file to upload afterwards. The file store is one; an
// object store's Put needs a rewindable reader to retry, so it is not.
type streamStore interface {
	Store
	create(ctx context.Context, name string) (objectWriter, error)
}

// objectWriter is an object being written through a streamStore. Commit
// makes it visible whole (as Put does); Abort discards it. Exactly one of
// them must be called.
type objectWriter interface {
	io.Writer
	Commit() error
	Abort()
}

// asStreamStore returns s (or the store a RetryStore wraps: a stream
// cannot be rewound, so it is written without retries) as a streamStore.
func asStreamStore(s Store) (streamStore, bool) {
	if r, ok := s.(*RetryStore); ok {
		s = r.s
	}
	ss, ok := s.(streamStore)
	return ss, ok
}

// validName checks an object name: relative, slash-separated, clean.
func validName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") || strings.HasSuffix(name, "/") || path.Clean(name) != name ||
		name == ".." || strings.HasPrefix(name, "../") || strings.Contains(name, "\\") {
		return fmt.Errorf("checkpoint: invalid object name %q", name)
	}
	return nil
}

// readAll reads a whole object.
func readAll(ctx context.Context, s Store, name string) ([]byte, error) {
	rc, err := s.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read %s: %w", name, err)
	}
	return b, nil
}

// listAll collects List's results.
func listAll(ctx context.Context, s Store, prefix string) ([]ObjectInfo, error) {
	var out []ObjectInfo
	err := s.List(ctx, prefix, func(o ObjectInfo) error {
		out = append(out, o)
		return nil
	})
	return out, err
}
