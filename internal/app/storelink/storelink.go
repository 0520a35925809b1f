// Package storelink puts a checkpoint store behind a simulated network link:
// a bandwidth per direction and a latency per request, as a remote object
// store has. `cairn demo --link` runs the job's store behind one, so that a
// restore from the store costs on a laptop what it costs across a network.
// The bandwidth is the drill's token bucket (drill.ThrottledStore); this
// package adds the per-request latency and the flag syntax.
package storelink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"cairn/checkpoint"
	"cairn/internal/app/drill"
	"cairn/internal/app/job"
)

// ErrSyntax is a link spec that does not parse.
var ErrSyntax = errors.New("storelink: bad link")

// Link is a simulated network link to the store.
type Link struct {
	// Bandwidth is bytes per second in each direction (0: unlimited).
	Bandwidth int64
	// Latency is added to every request (a read's or write's first byte, a
	// listing, a stat, a delete).
	Latency time.Duration
}

// Off reports whether the link changes nothing.
func (l Link) Off() bool { return l.Bandwidth <= 0 && l.Latency <= 0 }

// Parse reads "25MB/s,20ms" (bandwidth per direction, latency per
// request), "25MB/s", "20ms", or "off".
func Parse(s string) (Link, error) {
	var l Link
	s = strings.TrimSpace(s)
	if s == "" || s == "off" {
		return l, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if d, err := time.ParseDuration(part); err == nil {
			if d < 0 || l.Latency != 0 {
				return Link{}, fmt.Errorf("%w %q: one latency of at least 0, like 20ms", ErrSyntax, s)
			}
			l.Latency = d
			continue
		}
		n, err := job.ParseBytes(strings.TrimSuffix(part, "/s"))
		if err != nil || n <= 0 || l.Bandwidth != 0 {
			return Link{}, fmt.Errorf("%w %q: want BANDWIDTH/s,LATENCY like 25MB/s,20ms (or off)", ErrSyntax, s)
		}
		l.Bandwidth = n
	}
	return l, nil
}

// String is the link as Parse reads it.
func (l Link) String() string {
	if l.Off() {
		return "off"
	}
	var parts []string
	if l.Bandwidth > 0 {
		parts = append(parts, fmtRate(l.Bandwidth))
	}
	if l.Latency > 0 {
		parts = append(parts, l.Latency.String())
	}
	return strings.Join(parts, ",")
}

// fmtRate writes a bandwidth in the unit it was most likely given in.
func fmtRate(b int64) string {
	for _, u := range []struct {
		s string
		n int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}} {
		if b%u.n == 0 {
			return fmt.Sprintf("%d%s/s", b/u.n, u.s)
		}
	}
	return fmt.Sprintf("%dB/s", b)
}

// Wrap returns s behind the link (s itself when the link is off).
func (l Link) Wrap(s checkpoint.Store) checkpoint.Store {
	if l.Off() {
		return s
	}
	var inner checkpoint.Store = s
	if l.Bandwidth > 0 {
		inner = drill.NewThrottledStore(s, l.Bandwidth)
	}
	if l.Latency <= 0 {
		return inner
	}
	return &latencyStore{inner: inner, lat: l.Latency}
}

// latencyStore waits one latency before each request.
type latencyStore struct {
	inner checkpoint.Store
	lat   time.Duration
}

var _ checkpoint.Store = (*latencyStore)(nil)

func (s *latencyStore) wait(ctx context.Context) error {
	t := time.NewTimer(s.lat)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *latencyStore) Put(ctx context.Context, name string, r io.Reader) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.inner.Put(ctx, name, r)
}

func (s *latencyStore) Create(ctx context.Context, name string, data []byte) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.inner.Create(ctx, name, data)
}

func (s *latencyStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.inner.Get(ctx, name)
}

func (s *latencyStore) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.inner.GetRange(ctx, name, offset, length)
}

func (s *latencyStore) List(ctx context.Context, prefix string, fn func(checkpoint.ObjectInfo) error) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.inner.List(ctx, prefix, fn)
}

func (s *latencyStore) Delete(ctx context.Context, name string) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.inner.Delete(ctx, name)
}

func (s *latencyStore) Stat(ctx context.Context, name string) (checkpoint.ObjectInfo, error) {
	if err := s.wait(ctx); err != nil {
		return checkpoint.ObjectInfo{}, err
	}
	return s.inner.Stat(ctx, name)
}

func (s *latencyStore) Close(ctx context.Context) error { return s.inner.Close(ctx) }
