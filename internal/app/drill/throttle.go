package drill

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"cairn/checkpoint"
)

// Limiter is a token bucket of bytes per second. Callers take tokens after
// moving bytes and sleep off any debt, so the long-run rate never exceeds
// Rate while a transfer may run ahead by at most the burst. A nil *Limiter
// does not limit. Safe for concurrent use: parallel transfers share the rate,
// as they share a network link.
type Limiter struct {
	rate  float64 // bytes per second
	burst float64 // bytes

	mu struct {
		sync.Mutex
		// tokens is the bucket's level at last; negative is debt that the
		// caller that made it sleeps off.
		tokens float64
		// last is when tokens was computed.
		last time.Time
	}
}

// NewLimiter returns a limiter of bytesPerSec (nil when bytesPerSec <= 0).
// The burst is 1/20 of a second of traffic, at least 16 KiB, so a transfer
// of a few seconds holds the rate within a few percent.
func NewLimiter(bytesPerSec int64) *Limiter {
	if bytesPerSec <= 0 {
		return nil
	}
	l := &Limiter{rate: float64(bytesPerSec), burst: max(float64(bytesPerSec)/20, 16<<10)}
	l.mu.tokens = l.burst
	l.mu.last = time.Now()
	return l
}

// chunk is the most bytes one Read or Write moves before it pays: small
// enough that parallel transfers interleave fairly.
func (l *Limiter) chunk() int {
	if l == nil {
		return 1 << 20
	}
	return int(min(l.burst, 256<<10))
}

// Wait takes n bytes' worth of tokens, sleeping while the bucket is in debt.
func (l *Limiter) Wait(ctx context.Context, n int) error {
	if l == nil || n <= 0 {
		return nil
	}
	l.mu.Lock()
	now := time.Now()
	l.mu.tokens = min(l.burst, l.mu.tokens+now.Sub(l.mu.last).Seconds()*l.rate)
	l.mu.last = now
	l.mu.tokens -= float64(n)
	debt := -l.mu.tokens
	l.mu.Unlock()
	if debt <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(debt / l.rate * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ThrottledStore wraps a checkpoint.Store: the bytes of every Put, Create,
// Get and GetRange go through a Limiter per direction (a full-duplex link of
// Bandwidth bytes/s each way), and are counted. Listing, Stat and Delete are
// not limited (they are small).
type ThrottledStore struct {
	inner checkpoint.Store
	up    *Limiter
	down  *Limiter

	bytesUp   atomic.Int64
	bytesDown atomic.Int64
	gets      atomic.Int64

	busy struct {
		sync.Mutex
		// open counts the reads (Get, GetRange) not closed yet.
		open int
		// since is when open last went from 0 to 1.
		since time.Time
		// total is the time with at least one read open, before since.
		total time.Duration
	}
}

var _ checkpoint.Store = (*ThrottledStore)(nil)

// NewThrottledStore limits s to bytesPerSec in each direction (0: only count).
func NewThrottledStore(s checkpoint.Store, bytesPerSec int64) *ThrottledStore {
	return &ThrottledStore{inner: s, up: NewLimiter(bytesPerSec), down: NewLimiter(bytesPerSec)}
}

// BytesUp is the bytes written through the store so far.
func (t *ThrottledStore) BytesUp() int64 { return t.bytesUp.Load() }

// BytesDown is the bytes read through the store so far.
func (t *ThrottledStore) BytesDown() int64 { return t.bytesDown.Load() }

// Gets is the number of reads (Get, GetRange) so far: the objects of the
// restore model's per-object latency term.
func (t *ThrottledStore) Gets() int64 { return t.gets.Load() }

// BusyDown is the total time during which at least one read (Get,
// GetRange) was open: a transfer's time without the listing, manifest
// parsing and bookkeeping around it.
func (t *ThrottledStore) BusyDown() time.Duration {
	t.busy.Lock()
	defer t.busy.Unlock()
	d := t.busy.total
	if t.busy.open > 0 {
		d += time.Since(t.busy.since)
	}
	return d
}

func (t *ThrottledStore) readOpened() {
	t.busy.Lock()
	defer t.busy.Unlock()
	if t.busy.open == 0 {
		t.busy.since = time.Now()
	}
	t.busy.open++
}

func (t *ThrottledStore) readClosed() {
	t.busy.Lock()
	defer t.busy.Unlock()
	t.busy.open--
	if t.busy.open == 0 {
		t.busy.total += time.Since(t.busy.since)
	}
}

// Put implements checkpoint.Store.
func (t *ThrottledStore) Put(ctx context.Context, name string, r io.Reader) error {
	return t.inner.Put(ctx, name, &throttledReader{ctx: ctx, r: r, l: t.up, n: &t.bytesUp})
}

// Create implements checkpoint.Store.
func (t *ThrottledStore) Create(ctx context.Context, name string, data []byte) error {
	if err := t.up.Wait(ctx, len(data)); err != nil {
		return err
	}
	t.bytesUp.Add(int64(len(data)))
	return t.inner.Create(ctx, name, data)
}

// Get implements checkpoint.Store.
func (t *ThrottledStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	t.gets.Add(1)
	t.readOpened()
	rc, err := t.inner.Get(ctx, name)
	if err != nil {
		t.readClosed()
		return nil, err
	}
	return &throttledReadCloser{throttledReader: throttledReader{ctx: ctx, r: rc, l: t.down, n: &t.bytesDown}, c: rc, done: t.readClosed}, nil
}

// GetRange implements checkpoint.Store.
func (t *ThrottledStore) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	t.gets.Add(1)
	t.readOpened()
	rc, err := t.inner.GetRange(ctx, name, offset, length)
	if err != nil {
		t.readClosed()
		return nil, err
	}
	return &throttledReadCloser{throttledReader: throttledReader{ctx: ctx, r: rc, l: t.down, n: &t.bytesDown}, c: rc, done: t.readClosed}, nil
}

// List implements checkpoint.Store.
func (t *ThrottledStore) List(ctx context.Context, prefix string, fn func(checkpoint.ObjectInfo) error) error {
	return t.inner.List(ctx, prefix, fn)
}

// Delete implements checkpoint.Store.
func (t *ThrottledStore) Delete(ctx context.Context, name string) error {
	return t.inner.Delete(ctx, name)
}

// Stat implements checkpoint.Store.
func (t *ThrottledStore) Stat(ctx context.Context, name string) (checkpoint.ObjectInfo, error) {
	return t.inner.Stat(ctx, name)
}

// Close implements checkpoint.Store.
func (t *ThrottledStore) Close(ctx context.Context) error { return t.inner.Close(ctx) }

// throttledReader pays for every chunk it returns.
type throttledReader struct {
	ctx context.Context
	r   io.Reader
	l   *Limiter
	n   *atomic.Int64
}

func (r *throttledReader) Read(p []byte) (int, error) {
	if c := r.l.chunk(); len(p) > c {
		p = p[:c]
	}
	n, err := r.r.Read(p)
	if n > 0 {
		r.n.Add(int64(n))
		if werr := r.l.Wait(r.ctx, n); werr != nil && err == nil {
			err = werr
		}
	}
	return n, err
}

type throttledReadCloser struct {
	throttledReader
	c io.Closer
	// done ends the read's busy interval, once.
	done func()
	once sync.Once
}

func (r *throttledReadCloser) Close() error {
	r.once.Do(r.done)
	return r.c.Close()
}
