package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// sourceStallAfter is how long the source may wait for a message while
// the server says messages are pending before the consumer is replaced.
const sourceStallAfter = 10 * time.Second

// sourceReader reads the input stream with an ordered consumer and
// replaces the consumer when it stalls.
//
// The client library's ordered consumer recreates itself when its
// heartbeats stop, but not every stall stops them, and a recreation that
// keeps failing retries without end and without a word: after a cluster
// node was killed, a source was seen to receive nothing for minutes with
// the stream holding hundreds of messages past it, while the rest of the
// job ran on. So a watchdog asks the server, whenever the reader has
// waited sourceStallAfter for a message, whether the consumer has
// messages pending; if it has, or cannot say within a few seconds, a new
// ordered consumer takes over from after the last message delivered.
// Messages are handed on in stream order and at most once: one the old
// consumer still delivers after the new one started is dropped by its
// sequence.
type sourceReader struct {
	b       *natsBroker
	filters []string
	stall   time.Duration

	mu       sync.Mutex
	cons     jetstream.Consumer
	it       jetstream.MessagesContext
	stopping atomic.Bool
	stopped  chan struct{} // closed by stop

	lastSeq atomic.Uint64 // the last stream sequence handed on
	waiting atomic.Int64  // unix nanos since the reader waits in Next; 0 when not waiting
	// replaced counts consumers replaced after a stall (tests).
	replaced atomic.Int64
}

// open starts an ordered consumer from seq and makes it current.
func (r *sourceReader) open(ctx context.Context, seq uint64) error {
	cfg := r.b.cfg
	if r.stopped == nil {
		r.stopped = make(chan struct{})
	}
	cons, err := r.b.js.OrderedConsumer(ctx, cfg.InputStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: r.filters,
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    max(seq, 1),
	})
	if err != nil {
		return fmt.Errorf("engine: source %s: %w", cfg.InputStream, err)
	}
	// Bounded in bytes too: 4*BatchSize messages near max_payload are more
	// than the server's max_pending (64 MiB), which closes the connection.
	it, err := cons.Messages(jetstream.PullMaxMessagesWithBytesLimit(4*cfg.BatchSize, max(16<<20, int(r.b.nc.MaxPayload())+64<<10)))
	if err != nil {
		return fmt.Errorf("engine: source %s: consume: %w", cfg.InputStream, err)
	}
	r.mu.Lock()
	old := r.it
	r.cons, r.it = cons, it
	stopping := r.stopping.Load()
	r.mu.Unlock()
	if old != nil {
		old.Stop()
	}
	if stopping {
		it.Stop()
	}
	return nil
}

func (r *sourceReader) current() (jetstream.Consumer, jetstream.MessagesContext) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cons, r.it
}

func (r *sourceReader) stop() {
	if r.stopping.Swap(true) {
		return
	}
	close(r.stopped)
	_, it := r.current()
	it.Stop()
}

// read hands the messages on to msgs until stopped.
func (r *sourceReader) read(ctx context.Context, msgs chan<- Message, done chan<- struct{}) {
	defer close(done)
	stream := r.b.cfg.InputStream
	for {
		_, it := r.current()
		r.waiting.Store(time.Now().UnixNano())
		m, err := it.Next()
		r.waiting.Store(0)
		if r.stopping.Load() {
			return
		}
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				if _, cur := r.current(); cur != it {
					continue // the watchdog replaced the consumer
				}
				return
			}
			r.b.log.Warn("source: next message", "stream", stream, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		seq, tsNanos, ok := ackReplyMeta(m.Reply())
		if !ok {
			md, err := m.Metadata()
			if err != nil {
				r.b.log.Error("source: message without metadata skipped", "stream", stream, "subject", m.Subject(), "err", err)
				continue
			}
			seq, tsNanos = md.Sequence.Stream, md.Timestamp.UnixNano()
		}
		if seq <= r.lastSeq.Load() {
			continue // the replaced consumer's, handed on already
		}
		select {
		case msgs <- Message{Seq: seq, TsNanos: tsNanos, Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}:
			r.lastSeq.Store(seq)
		case <-ctx.Done():
			return
		}
	}
}

// watch replaces the consumer when the reader has waited r.stall for a
// message the server holds for it.
func (r *sourceReader) watch(ctx context.Context, done <-chan struct{}) {
	t := time.NewTicker(max(r.stall/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-r.stopped:
			return
		case <-t.C:
		}
		since := r.waiting.Load()
		if since == 0 || time.Since(time.Unix(0, since)) < r.stall {
			continue
		}
		cons, _ := r.current()
		pending, why := r.pending(ctx, cons)
		if pending == 0 && why == "" {
			continue
		}
		from := r.lastSeq.Load() + 1
		r.b.log.Warn("source: the consumer delivered nothing while the stream holds messages for it; a new consumer takes over",
			"stream", r.b.cfg.InputStream, "waited", time.Since(time.Unix(0, since)).Round(time.Millisecond), "pending", pending, "info", why, "from_seq", from)
		if err := r.open(ctx, from); err != nil {
			r.b.log.Warn("source: replace the consumer", "stream", r.b.cfg.InputStream, "err", err)
			continue
		}
		r.replaced.Add(1)
	}
}

// pending asks the server how many messages the consumer has not
// delivered yet; why is non-empty when it could not say in time (the
// library holds the consumer's lock while it recreates the consumer, so
// the answer may never come).
func (r *sourceReader) pending(ctx context.Context, cons jetstream.Consumer) (n uint64, why string) {
	type answer struct {
		info *jetstream.ConsumerInfo
		err  error
	}
	ch := make(chan answer, 1)
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	go func() {
		info, err := cons.Info(ictx)
		ch <- answer{info, err}
	}()
	select {
	case a := <-ch:
		if a.err != nil {
			return 0, a.err.Error()
		}
		return a.info.NumPending, ""
	case <-ictx.Done():
		return 0, "no answer within 5s"
	}
}
