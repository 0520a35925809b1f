package checkpoint

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// memStore is an in-memory Store with an injectable clock, for fast tests
// and the GC property test.
type memStore struct {
	now func() time.Time
	mu  struct {
		sync.Mutex
		objs map[string]memObj
	}
}

type memObj struct {
	data []byte
	mod  time.Time
}

var _ Store = (*memStore)(nil)

func newMemStore(now func() time.Time) *memStore {
	s := &memStore{now: now}
	s.mu.objs = map[string]memObj{}
	return s
}

func (s *memStore) Put(ctx context.Context, name string, r io.Reader) error {
	if err := validName(name); err != nil {
		return err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.objs[name] = memObj{b, s.now()}
	return nil
}

func (s *memStore) Create(ctx context.Context, name string, data []byte) error {
	if err := validName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.mu.objs[name]; ok {
		return fmt.Errorf("create %s: %w", name, ErrExists)
	}
	s.mu.objs[name] = memObj{bytes.Clone(data), s.now()}
	return nil
}

func (s *memStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	return s.GetRange(ctx, name, 0, -1)
}

func (s *memStore) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.mu.objs[name]
	if !ok {
		return nil, fmt.Errorf("get %s: %w", name, ErrNotFound)
	}
	if offset > int64(len(o.data)) {
		return nil, fmt.Errorf("get %s: offset beyond end", name)
	}
	end := int64(len(o.data))
	if length >= 0 && offset+length < end {
		end = offset + length
	}
	return io.NopCloser(bytes.NewReader(o.data[offset:end])), nil
}

func (s *memStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	s.mu.Lock()
	var out []ObjectInfo
	for n, o := range s.mu.objs {
		if strings.HasPrefix(n, prefix) {
			out = append(out, ObjectInfo{Name: n, Size: int64(len(o.data)), ModTime: o.mod})
		}
	}
	s.mu.Unlock()
	for _, o := range out {
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

func (s *memStore) Delete(ctx context.Context, name string) error {
	if err := validName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mu.objs, name)
	return nil
}

func (s *memStore) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	if err := validName(name); err != nil {
		return ObjectInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.mu.objs[name]
	if !ok {
		return ObjectInfo{}, fmt.Errorf("stat %s: %w", name, ErrNotFound)
	}
	return ObjectInfo{Name: name, Size: int64(len(o.data)), ModTime: o.mod}, nil
}

func (s *memStore) Close(ctx context.Context) error { return nil }
