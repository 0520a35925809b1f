package recovery

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"cairn/checkpoint"
)

// storeView is the read side of a Store for full (canonical) restores: it
// serves an object from the standby cache when the cache's trust index
// vouches for the file, from the store otherwise, and counts the bytes each
// side delivered. Only reads are supported.
type storeView struct {
	checkpoint.Store
	job      string
	objects  map[string]checkpoint.Object
	cacheDir string
	cacheIdx *checkpoint.TrustIndex
	c        *counters

	mu struct {
		sync.Mutex
		// fromCache and fromStore are the objects each side served.
		fromCache, fromStore map[string]bool
	}
}

func (v *storeView) served(name string, cache bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mu.fromCache == nil {
		v.mu.fromCache, v.mu.fromStore = map[string]bool{}, map[string]bool{}
	}
	if cache {
		v.mu.fromCache[name] = true
	} else {
		v.mu.fromStore[name] = true
	}
}

// files returns how many distinct objects the cache and the store served.
func (v *storeView) files() (cache, store int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.mu.fromCache), len(v.mu.fromStore)
}

func (v *storeView) cached(name string) (string, bool) {
	o, ok := v.objects[name]
	if !ok || v.cacheDir == "" {
		return "", false
	}
	rel := cacheRel(v.job, name)
	p := filepath.Join(v.cacheDir, filepath.FromSlash(rel))
	return p, v.cacheIdx.Trusts(rel, p, o)
}

func (v *storeView) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	return v.GetRange(ctx, name, 0, -1)
}

func (v *storeView) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	if p, ok := v.cached(name); ok {
		f, err := os.Open(p)
		if err == nil {
			size := v.objects[name].Size
			if length < 0 || offset+length > size {
				length = size - offset
			}
			if offset >= 0 && length >= 0 {
				v.served(name, true)
				return &countingReader{ReadCloser: readCloser{io.NewSectionReader(f, offset, length), f}, a: &v.c.bytesCache, done: &v.c.bytesDone}, nil
			}
			f.Close()
		}
	}
	var rc io.ReadCloser
	var err error
	if offset == 0 && length < 0 {
		rc, err = v.Store.Get(ctx, name)
	} else {
		rc, err = v.Store.GetRange(ctx, name, offset, length)
	}
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", name, err)
	}
	v.served(name, false)
	return &countingReader{ReadCloser: rc, a: &v.c.bytesDownloaded, done: &v.c.bytesDone}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

type countingReader struct {
	io.ReadCloser
	a, done interface{ Add(int64) int64 }
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.a.Add(int64(n))
	c.done.Add(int64(n))
	return n, err
}
