package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// DefaultStopTimeout bounds a graceful stop: past it the final checkpoint is
// given up and the process exits non-zero.
const DefaultStopTimeout = 30 * time.Second

// DefaultNATSUnreachable bounds how long a job waits for its NATS server:
// past it the job stops with ErrNATSUnreachable.
const DefaultNATSUnreachable = 3 * time.Minute

// abortGrace is how long Run waits for the engines to end once a stop
// timed out and they were aborted. A slot can be stuck in a publish whose
// flow control waits for acknowledgements that will not come (the fast
// batch's stall has no context, only its own 30 s timeout); past the grace
// Run returns without it and Close leaves what the engines still use:
// their goroutines die with the process, as in a kill, which every
// committed checkpoint survives.
const abortGrace = 5 * time.Second

// ErrStopTimedOut is returned by Run when a graceful stop could not take
// its final checkpoint within the stop timeout.
var ErrStopTimedOut = errors.New("runtime: the final checkpoint could not be taken before the stop timeout")

// ErrStoppedWaitingBroker is returned by Run when a graceful stop came
// while the job waited to resume from a broker fault: like a timed-out
// stop, it ends without a final checkpoint.
var ErrStoppedWaitingBroker = errors.New("runtime: stopped while waiting for the broker, so the final checkpoint could not be taken")

// ErrNATSUnreachable stops a job whose NATS server stayed unreachable
// longer than its bound.
var ErrNATSUnreachable = errors.New("runtime: the NATS server stayed unreachable")

// natsLink follows the job's NATS connection: since when it is down (zero:
// up), for the stop's error and the unreachable bound.
type natsLink struct {
	url string
	log *slog.Logger

	mu        sync.Mutex
	downSince time.Time
	downErr   error
	// drops counts the disconnects so far: a failure in a run that saw
	// one may be a publish lost with the connection (resumable).
	drops int
}

func newNATSLink(url string, log *slog.Logger) *natsLink {
	return &natsLink{url: RedactURL(url), log: log}
}

// options are the connection's handlers that keep the link's state.
func (l *natsLink) options() []nats.Option {
	return []nats.Option{
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err == nil && (nc.IsClosed() || nc.IsDraining()) {
				return // our own close
			}
			l.mu.Lock()
			if l.downSince.IsZero() {
				l.downSince, l.downErr = time.Now(), err
			}
			l.drops++
			l.mu.Unlock()
			l.log.Warn("nats: disconnected; the job waits for the server (publishes are buffered, the input pauses)", "server", l.url, "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			l.mu.Lock()
			since := l.downSince
			l.downSince, l.downErr = time.Time{}, nil
			l.mu.Unlock()
			l.log.Info("nats: reconnected; the job goes on", "server", RedactURL(nc.ConnectedUrlRedacted()), "down_for", time.Since(since).Round(time.Millisecond))
		}),
	}
}

// down returns since when the connection is down (zero: it is up).
func (l *natsLink) down() (time.Time, error) {
	if l == nil {
		return time.Time{}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.downSince, l.downErr
}

// disconnects returns how often the connection dropped so far.
func (l *natsLink) disconnects() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.drops
}

// watch stops the job (fail) once the connection has been down longer than
// limit; it returns when ctx ends.
func (l *natsLink) watch(ctx context.Context, limit time.Duration, fail func(error)) {
	t := time.NewTicker(min(limit/4, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		since, cause := l.down()
		if since.IsZero() || time.Since(since) < limit {
			continue
		}
		err := fmt.Errorf("%w: %s unreachable for %s (the limit; --nats-unreachable-limit): stopping; the next start restores the last committed checkpoint and goes on exactly",
			ErrNATSUnreachable, l.url, time.Since(since).Round(time.Second))
		if cause != nil {
			err = fmt.Errorf("%w (disconnected: %v)", err, cause)
		}
		fail(err)
		return
	}
}

// Run runs every sub-topology's engine until ctx ends (a graceful stop:
// each takes its final checkpoint) or one fails (the others then stop
// gracefully too). The stop is bounded: when the final checkpoints are not
// all taken within the stop timeout (Options.StopTimeout), they are given
// up and Run returns ErrStopTimedOut, naming the checkpoints the next start
// restores. The NATS server unreachable longer than Options.NATSUnreachable
// stops the job with ErrNATSUnreachable.
func (r *Running) Run(ctx context.Context) error {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	all := r.SubTopologies()
	failAll := func(err error) {
		for _, s := range all {
			s.Engine.Fail(err)
		}
	}
	if err := r.checkInputs(ctx, true); err != nil {
		return err
	}
	if r.NC != nil {
		go r.watchInputs(wctx, failAll)
	}
	if r.link != nil && r.unreachable > 0 {
		go r.link.watch(wctx, r.unreachable, func(err error) {
			for _, s := range all {
				s.Engine.Fail(err)
			}
		})
	}
	done := make(chan error, 1)
	// A sub-topology that fails stops the others gracefully: that stop
	// is bounded as the user's is.
	subFailed := make(chan struct{})
	var once sync.Once
	var firstErr error // the failure, set before subFailed closes
	go func() {
		done <- r.runAll(ctx, func(err error) {
			once.Do(func() { firstErr = err; close(subFailed) })
		})
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	case <-subFailed:
	}
	timeout := r.stopTimeout
	if timeout <= 0 {
		timeout = DefaultStopTimeout
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	}
	abortErr := r.stopTimedOut(timeout)
	for _, s := range all {
		s.Engine.Abort(abortErr)
	}
	select {
	case err := <-done:
		if err == nil || errors.Is(err, ErrStopTimedOut) && !subFailedFirst(ctx, subFailed) {
			return abortErr
		}
		return errors.Join(err, abortErr)
	case <-time.After(abortGrace):
		r.abandoned.Store(true)
		r.log.Warn("stop: the engines did not end after their final checkpoint was given up; leaving them to end with the process (as a kill: committed checkpoints are untouched)", "grace", abortGrace)
		if subFailedFirst(ctx, subFailed) {
			return errors.Join(firstErr, abortErr)
		}
		return abortErr
	}
}

// subFailedFirst reports whether the stop began with a sub-topology's
// failure (its error then leads), not the caller's stop.
func subFailedFirst(ctx context.Context, subFailed <-chan struct{}) bool {
	select {
	case <-subFailed:
		return ctx.Err() == nil
	default:
		return false
	}
}

// stopTimedOut is the error of a stop that gave up its final checkpoint:
// why (the NATS server, when it is down), and what the next start restores.
func (r *Running) stopTimedOut(timeout time.Duration) error {
	why := ""
	if since, _ := r.link.down(); !since.IsZero() {
		why = fmt.Sprintf(" (NATS server %s unreachable for %s)", r.link.url, time.Since(since).Round(time.Second))
	}
	var parts []string
	for _, s := range r.SubTopologies() {
		name := ""
		if len(r.Downstream) > 0 {
			name = s.Job.Name + ": "
		}
		var last string
		if s.Writer == nil {
			last = "no checkpoints: the next start reads the input from the first message"
		} else if c := s.Writer.Committed(); len(c) == 0 {
			last = "no checkpoint committed yet: the next start reads the input from the first message"
		} else {
			m := c[len(c)-1]
			last = fmt.Sprintf("the next start restores checkpoint %d (source_seq %d)", m.ID, m.SourceSeq)
		}
		parts = append(parts, name+last)
	}
	return fmt.Errorf("%w (%s, --stop-timeout)%s: nothing committed is lost; %s", ErrStopTimedOut, timeout, why, strings.Join(parts, "; "))
}
