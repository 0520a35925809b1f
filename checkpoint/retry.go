package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"time"
)

// RetryOptions tune a RetryStore.
type RetryOptions struct {
	// Attempts is the number of tries per operation (default 5).
	Attempts int
	// Base is the first backoff (default 100ms); it doubles per attempt.
	Base time.Duration
	// Max caps one backoff (default 5s).
	Max time.Duration
}

// RetryStore wraps a Store and retries operations that fail with a transient
// error (HTTP 5xx or 429, timeouts, connection resets) with exponential
// backoff and full jitter. It never retries 4xx answers, precondition
// failures, ErrNotFound, ErrExists, corruption or fsync errors, nor a Put
// whose reader cannot be rewound (not an io.Seeker).
type RetryStore struct {
	s    Store
	opts RetryOptions
}

var _ Store = (*RetryStore)(nil)

// NewRetryStore wraps s.
func NewRetryStore(s Store, opts RetryOptions) *RetryStore {
	if opts.Attempts <= 0 {
		opts.Attempts = 5
	}
	if opts.Base <= 0 {
		opts.Base = 100 * time.Millisecond
	}
	if opts.Max <= 0 {
		opts.Max = 5 * time.Second
	}
	return &RetryStore{s: s, opts: opts}
}

// transientError marks an error as retryable regardless of its cause.
type transientError struct{ err error }

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() error { return e.err }

// permanentError marks an error as not retryable regardless of its cause.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// IsTransient reports whether err is worth retrying.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var pe permanentError
	if errors.As(err, &pe) {
		return false
	}
	var te transientError
	if errors.As(err, &te) {
		return true
	}
	var se *SyncError
	var ce *CorruptionError
	if errors.As(err, &se) || errors.As(err, &ce) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrExists) ||
		errors.Is(err, context.Canceled) {
		return false
	}
	var status interface{ HTTPStatusCode() int }
	if errors.As(err, &status) {
		c := status.HTTPStatusCode()
		return c >= 500 || c == 429 || c == 408
	}
	var api interface{ ErrorCode() string }
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "SlowDown", "InternalError", "RequestTimeout", "ServiceUnavailable", "Throttling", "ThrottlingException":
			return true
		}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF)
}

func (s *RetryStore) do(ctx context.Context, fn func() error) error {
	var err error
	for attempt := 0; attempt < s.opts.Attempts; attempt++ {
		if attempt > 0 {
			backoff := min(s.opts.Base<<(attempt-1), s.opts.Max)
			t := time.NewTimer(rand.N(backoff) + 1)
			select {
			case <-ctx.Done():
				t.Stop()
				return errors.Join(err, ctx.Err())
			case <-t.C:
			}
		}
		err = fn()
		if err == nil || !IsTransient(err) || ctx.Err() != nil {
			return err
		}
	}
	return fmt.Errorf("after %d attempts: %w", s.opts.Attempts, err)
}

func (s *RetryStore) Put(ctx context.Context, name string, r io.Reader) error {
	seeker, ok := r.(io.Seeker)
	if !ok {
		return s.s.Put(ctx, name, r)
	}
	start, err := seeker.Seek(0, io.SeekCurrent)
	if err != nil {
		return s.s.Put(ctx, name, r)
	}
	first := true
	return s.do(ctx, func() error {
		if !first {
			if _, err := seeker.Seek(start, io.SeekStart); err != nil {
				return err
			}
		}
		first = false
		return s.s.Put(ctx, name, r)
	})
}

// Create retries, and treats ErrExists after a failed attempt as success when
// the stored object is byte-identical (the earlier attempt landed but its
// answer was lost).
func (s *RetryStore) Create(ctx context.Context, name string, data []byte) error {
	failed := false
	err := s.do(ctx, func() error {
		err := s.s.Create(ctx, name, data)
		if err != nil && !errors.Is(err, ErrExists) {
			failed = true
		}
		return err
	})
	if failed && errors.Is(err, ErrExists) {
		if got, rerr := readAll(ctx, s.s, name); rerr == nil && bytes.Equal(got, data) {
			return nil
		}
	}
	return err
}

func (s *RetryStore) Get(ctx context.Context, name string) (rc io.ReadCloser, err error) {
	err = s.do(ctx, func() error { rc, err = s.s.Get(ctx, name); return err })
	return rc, err
}

func (s *RetryStore) GetRange(ctx context.Context, name string, offset, length int64) (rc io.ReadCloser, err error) {
	err = s.do(ctx, func() error { rc, err = s.s.GetRange(ctx, name, offset, length); return err })
	return rc, err
}

// List retries only when it fails before delivering any object.
func (s *RetryStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	delivered := false
	return s.do(ctx, func() error {
		err := s.s.List(ctx, prefix, func(o ObjectInfo) error { delivered = true; return fn(o) })
		if err != nil && delivered {
			return permanentError{err} // not retried: fn saw part of the listing
		}
		return err
	})
}

func (s *RetryStore) Delete(ctx context.Context, name string) error {
	return s.do(ctx, func() error { return s.s.Delete(ctx, name) })
}

func (s *RetryStore) Stat(ctx context.Context, name string) (o ObjectInfo, err error) {
	err = s.do(ctx, func() error { o, err = s.s.Stat(ctx, name); return err })
	return o, err
}

func (s *RetryStore) Close(ctx context.Context) error { return s.s.Close(ctx) }
