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
//
// Each consumer's iterator is read by a goroutine of its own (a pump), and
// only the current consumer's pump hands messages on. A consumer stuck
// inside the library (a recreation it retries without end, holding the
// consumer's lock, so that neither its Next nor its Stop returns) is
// therefore left behind: the new consumer's pump delivers, the stuck one's
// Stop runs on a goroutine of its own, and a stop of the source does not
// wait for it either.
type sourceReader struct {
	b       *natsBroker
	filters []string
	stall   time.Duration

	// wrap, when set (tests), wraps each new iterator: a fault injected
	// into a consumer's reads.
	wrap func(jetstream.MessagesContext) jetstream.MessagesContext

	ctx  context.Context
	msgs chan<- Message

	mu       sync.Mutex
	cons     jetstream.Consumer
	cur      *sourcePump
	stopping atomic.Bool
	stopped  chan struct{} // closed by stop
	ended    chan struct{} // closed when the current iterator ends by itself
	endOnce  sync.Once

	// deliver is held by a pump while it hands a message on: the check
	// that it is still current and the send happen as one, so that once
	// a pump is replaced or the source stopped no other message follows.
	deliver sync.Mutex
	lastSeq atomic.Uint64 // the last stream sequence handed on
	// replaced counts consumers replaced after a stall (tests).
	replaced atomic.Int64
}

// sourcePump reads one consumer's iterator.
type sourcePump struct {
	it      jetstream.MessagesContext
	quit    chan struct{} // closed by halt
	once    sync.Once
	waiting atomic.Int64 // unix nanos since it waits in Next; 0 when not waiting
}

// halt ends p, when it is replaced or the source stops. Its iterator's
// Stop runs on a goroutine of its own: it may wait on the library's lock
// (see sourceReader).
func (p *sourcePump) halt() {
	p.once.Do(func() {
		close(p.quit)
		go p.it.Stop()
	})
}

// start opens an ordered consumer from seq and hands its messages on to
// msgs until stop is called or ctx ends; done is closed once nothing more
// will be sent.
func (r *sourceReader) start(ctx context.Context, seq uint64, msgs chan<- Message) (done <-chan struct{}, err error) {
	r.ctx, r.msgs = ctx, msgs
	r.stopped, r.ended = make(chan struct{}), make(chan struct{})
	r.lastSeq.Store(max(seq, 1) - 1)
	if err := r.open(ctx, seq); err != nil {
		return nil, err
	}
	d := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-r.stopped:
		case <-r.ended:
		}
		// A pump in the middle of a send sees the same ends and lets go;
		// after that none sends again.
		r.deliver.Lock()
		r.stopping.Store(true)
		r.deliver.Unlock()
		close(d)
	}()
	return d, nil
}

// open starts an ordered consumer from seq, makes it current and starts
// its pump; the consumer it replaces is stopped without waiting for it.
func (r *sourceReader) open(ctx context.Context, seq uint64) error {
	cfg := r.b.cfg
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
	if r.wrap != nil {
		it = r.wrap(it)
	}
	p := &sourcePump{it: it, quit: make(chan struct{})}
	r.mu.Lock()
	old := r.cur
	r.cons, r.cur = cons, p
	stopping := r.stopping.Load()
	r.mu.Unlock()
	if old != nil {
		old.halt()
	}
	if stopping {
		p.halt()
		return nil
	}
	go r.pump(p)
	return nil
}

func (r *sourceReader) current() (jetstream.Consumer, *sourcePump) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cons, r.cur
}

func (r *sourceReader) stop() {
	r.mu.Lock()
	first := !r.stopping.Swap(true)
	p := r.cur
	r.mu.Unlock()
	if !first {
		return
	}
	close(r.stopped)
	p.halt()
}

// pump hands p's messages on until p is replaced, the source stops or
// its iterator ends.
func (r *sourceReader) pump(p *sourcePump) {
	stream := r.b.cfg.InputStream
	for {
		p.waiting.Store(time.Now().UnixNano())
		m, err := p.it.Next()
		p.waiting.Store(0)
		select {
		case <-p.quit:
			return
		default:
		}
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				// Not replaced, not stopped: the iterator ended by itself.
				r.endOnce.Do(func() { close(r.ended) })
				return
			}
			r.b.log.Warn("source: next message", "stream", stream, "err", err)
			select {
			case <-r.ctx.Done():
				return
			case <-p.quit:
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
		if !r.hand(p, Message{Seq: seq, TsNanos: tsNanos, Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}) {
			return
		}
	}
}

// hand sends m on unless p is no longer current or m was handed on
// already (by the consumer p replaced); false when p must stop.
func (r *sourceReader) hand(p *sourcePump, m Message) bool {
	r.deliver.Lock()
	defer r.deliver.Unlock()
	if r.stopping.Load() {
		return false
	}
	select {
	case <-p.quit:
		return false
	default:
	}
	if m.Seq <= r.lastSeq.Load() {
		return true
	}
	select {
	case r.msgs <- m: // the usual case: room in the channel
		r.lastSeq.Store(m.Seq)
		return true
	default:
	}
	select {
	case r.msgs <- m:
		r.lastSeq.Store(m.Seq)
		return true
	case <-r.ctx.Done():
	case <-p.quit:
	case <-r.stopped:
	case <-r.ended:
	}
	return false
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
		cons, p := r.current()
		since := p.waiting.Load()
		if since == 0 || time.Since(time.Unix(0, since)) < r.stall {
			continue
		}
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
