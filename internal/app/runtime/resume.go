package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/job"
)

// Why a job waits for its broker between two runs in one process, the
// values of BrokerWait.Reason.
const (
	// WaitStreamFull: an output or repartition stream (or the account's
	// JetStream storage) is at its limit with discard new.
	WaitStreamFull = "stream_full"
	// WaitPublishLost: publishes in flight were lost with the connection
	// (a server restart, a reset); the job waits for the server.
	WaitPublishLost = "publish_lost"
)

// BrokerWait is what the job waits for, while it waits (zero: it does not).
type BrokerWait struct {
	Reason string    `json:"reason,omitempty"`
	Stream string    `json:"stream,omitempty"` // the full stream ("" for the account, or not known)
	Detail string    `json:"detail,omitempty"` // the error that made the job wait
	Since  time.Time `json:"since"`
	// Resumes counts the runs resumed in this process so far.
	Resumes int `json:"resumes"`
}

// brokerWaits is the wait state, shared by the runs of one process.
type brokerWaits struct {
	mu sync.Mutex
	w  BrokerWait
}

func (b *brokerWaits) get() BrokerWait {
	if b == nil {
		return BrokerWait{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.w
}

func (b *brokerWaits) set(reason, stream, detail string) {
	b.mu.Lock()
	b.w.Reason, b.w.Stream, b.w.Detail, b.w.Since = reason, stream, detail, time.Now()
	b.mu.Unlock()
}

func (b *brokerWaits) resumed() {
	b.mu.Lock()
	b.w = BrokerWait{Resumes: b.w.Resumes + 1}
	b.mu.Unlock()
}

// BrokerWait is what the job waits for now (zero Reason: nothing).
func (r *Running) BrokerWait() BrokerWait { return r.waits.get() }

// brokerWaitSnapshot is the dashboard's view of the wait (nil: none).
func (r *Running) brokerWaitSnapshot() *dashboard.BrokerWait {
	w := r.waits.get()
	if w.Reason == "" {
		return nil
	}
	return &dashboard.BrokerWait{Reason: w.Reason, Stream: w.Stream, Detail: w.Detail, Since: w.Since}
}

// RunResuming runs r like Run and, when the job stopped on a broker fault
// it can outlive, resumes it in this process: it waits for what is missing
// (the server back; room in a full stream), closes the run and starts the
// job again from its last committed checkpoint, which skips, key group by
// key group, the outputs the streams already hold. serve is called with
// every run (the HTTP server); its stop function is called before the run
// closes. RunResuming returns the last run, for the caller to Close (nil
// when a resume's Start failed: everything is closed then).
func RunResuming(ctx context.Context, r *Running, j *job.Job, ro Options, log *slog.Logger, serve func(*Running) (stop func())) (*Running, error) {
	waits := &brokerWaits{}
	backoff := time.Second
	// idle counts the resumes in a row whose runs committed no checkpoint:
	// a fault that returns at once, run after run, is not one to outlive.
	idle := 0
	for {
		r.setWaits(waits)
		stop := serve(r)
		drops := r.link.disconnects()
		began, committedBefore := time.Now(), r.newestCommitted()
		err := r.Run(ctx)
		reason, stream := r.resumable(ctx, err, drops)
		if reason == "" {
			stop()
			return r, err
		}
		// A full stream the error did not name is waited for on the
		// account's room alone, which can be there at once: such resumes
		// count too, or a stream that stays full would rewind forever.
		if r.newestCommitted() == committedBefore && (reason == WaitPublishLost || stream == "") {
			idle++
		} else {
			idle = 0
		}
		if idle > maxIdleResumes {
			stop()
			return r, fmt.Errorf("runtime: %d resumes in a row committed no checkpoint; stopping: %w", maxIdleResumes, err)
		}
		waits.set(reason, stream, err.Error())
		log.Warn("broker: the job stopped on a fault it outlives; it waits and resumes in this process from its last committed checkpoint (skipping the outputs already published)",
			"reason", reason, "stream", stream, "err", err)
		if time.Since(began) > time.Minute {
			backoff = time.Second
		}
		werr := r.waitBroker(ctx, reason, stream, backoff)
		backoff = min(2*backoff, 30*time.Second)
		stop()
		if werr != nil {
			// One line, the reason the job ends first: the run's error
			// is what it waited on.
			return r, fmt.Errorf("%w; the run had stopped on: %w", werr, err)
		}
		if r.newestCommitted() != committedBefore {
			// A checkpoint committed since the run began: the next run
			// restores the newest. Until one has, the run's own choice
			// stands (--restore none, a savepoint or an id: "latest" could
			// be an older checkpoint of the store than what it restored).
			ro.Restore = "latest"
			ro.StandbyCache = ""
		}
		r.Close()
		next, serr := startResuming(ctx, j, ro, log, backoff)
		if serr != nil {
			return nil, fmt.Errorf("runtime: resume after %s: %w", reason, serr)
		}
		waits.resumed()
		log.Info("broker: the job resumed in this process", "reason", reason, "start_seq", next.StartSeq, "resumes", waits.get().Resumes)
		r = next
	}
}

// startResuming starts the job again for a resume, trying again while the
// start fails on the broker's moment: a request that timed out or found no
// responder (a cluster node just killed, a stream's leader being elected).
// Every other error, a stop, or maxIdleResumes failed tries end it: a
// resume that cannot start ends the process as a start would.
func startResuming(ctx context.Context, j *job.Job, ro Options, log *slog.Logger, pause time.Duration) (*Running, error) {
	for try := 1; ; try++ {
		r, err := Start(ctx, j, ro, log)
		if err == nil || ctx.Err() != nil || try >= maxIdleResumes || !brokerMoment(err) {
			return r, err
		}
		log.Warn("broker: the resumed start failed on the broker's moment; trying again", "try", try, "pause", pause, "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pause):
		}
		pause = min(2*pause, 30*time.Second)
	}
}

// brokerMoment reports a start that failed because the broker did not
// answer in time (not because it refused: a refusal is the job's).
func brokerMoment(err error) bool {
	return !errors.Is(err, ErrNATSUnreachable) && !errors.Is(err, engine.ErrConfig) && !fenced(err) &&
		(errors.Is(err, context.DeadlineExceeded) || outcomeUnknown(err))
}

// newestCommitted is the newest checkpoint id each sub-topology's writer
// knows committed, joined ("" without checkpoints).
func (r *Running) newestCommitted() string {
	var ids []string
	for _, s := range r.SubTopologies() {
		id := "-"
		if s.Writer != nil {
			if c := s.Writer.Committed(); len(c) > 0 {
				id = fmt.Sprint(c[len(c)-1].ID)
			}
		}
		ids = append(ids, id)
	}
	return strings.Join(ids, ",")
}

// maxIdleResumes bounds the resumes in a row after lost publishes whose
// runs commit no checkpoint (a full stream waits for room instead).
const maxIdleResumes = 10

// setWaits shares the wait state with every sub-topology of the run.
func (r *Running) setWaits(w *brokerWaits) {
	for _, s := range r.SubTopologies() {
		s.waits = w
	}
}

// resumable says why a run's end is one the job outlives in this process
// ("" when it is not): a graceful stop, the unreachable bound, a stop that
// left engines behind (their state is still open) and every other failure
// end the process as before.
func (r *Running) resumable(ctx context.Context, err error, dropsBefore int) (reason, stream string) {
	if err == nil || ctx.Err() != nil || r.abandoned.Load() || r.link == nil {
		return "", ""
	}
	if errors.Is(err, ErrNATSUnreachable) || errors.Is(err, engine.ErrStreamDeleted) || errors.Is(err, engine.ErrConfig) || errors.Is(err, ErrWouldStartOver) ||
		errors.Is(err, ErrInputGap) || errors.Is(err, ErrInputDeleted) {
		return "", ""
	}
	if full, stream := storeFull(err); full {
		return WaitStreamFull, stream
	}
	if fenced(err) {
		return "", "" // another writer appended: this one must stop
	}
	if r.link.disconnects() > dropsBefore || errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) || outcomeUnknown(err) {
		return WaitPublishLost, ""
	}
	return "", ""
}

// unknownOutcome are the publish failures that leave it unknown whether
// the messages were stored, with the connection up: a stream leader lost
// on a cluster (the acknowledgement never comes, an empty or "no
// responders" reply, the new leader does not know the open batch), or a
// server too busy to answer in time. The rewind to the last committed
// checkpoint is safe for each: the restore skips what was stored.
// "nats: timeout" is the client's request timeout as text (a wrapped
// nats.ErrTimeout that lost its chain); a bare "timeout" would also match
// the job's own stop-timeout error and a store's "i/o timeout", and make
// failures that are not the broker's rewind instead of stop.
var unknownOutcome = []string{"ack timeout", "batch publish ID unknown", "unexpected end of JSON input", "no responders", "nats: timeout", "temporarily unavailable", "no response from stream"}

func outcomeUnknown(err error) bool {
	if errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
		return true
	}
	msg := err.Error()
	for _, s := range unknownOutcome {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// fenced reports a publish refused because the key group's subject moved
// on without this writer (an expected-last-sequence check failed): by the
// server's error code where the error kept it, else by its text (a fast
// batch's refusal comes back as text).
func fenced(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return true
	}
	return strings.Contains(err.Error(), "wrong last sequence")
}

// The server's refusals of a publish for want of room: a stream's limits
// with discard new (JetStream error 10077 carries the reason as text), or
// the account's storage.
var fullReasons = []string{"maximum messages exceeded", "maximum bytes exceeded", "maximum messages per subject exceeded", "resource limits exceeded for account", "insufficient resources"}

// The sink's errors name the stream or the subject they published to.
var (
	publishStreamRe  = regexp.MustCompile(`publish to stream ([^ :]+)`)
	publishSubjectRe = regexp.MustCompile(`publish to ([^ :]+):`)
)

// storeFull reports whether err is a publish refused for want of room, and
// the stream or subject it names ("" when none).
func storeFull(err error) (bool, string) {
	msg := err.Error()
	full := false
	for _, s := range fullReasons {
		if strings.Contains(msg, s) {
			full = true
		}
	}
	if !full {
		return false, ""
	}
	if m := publishStreamRe.FindStringSubmatch(msg); m != nil {
		return true, m[1]
	}
	if m := publishSubjectRe.FindStringSubmatch(msg); m != nil {
		return true, "subject:" + m[1]
	}
	return true, ""
}

// waitBroker waits until the run's fault is gone: the server reachable
// again (within the unreachable bound), and for a full stream room in it
// (a tenth of its limit free, or the limit raised) or in the account. It
// waits at least pause.
func (r *Running) waitBroker(ctx context.Context, reason, stream string, pause time.Duration) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w (%s): the next start restores the last committed checkpoint", ErrStoppedWaitingBroker, reason)
	case <-time.After(pause):
	}
	limit := r.unreachable
	if limit == 0 {
		limit = DefaultNATSUnreachable
	}
	js, err := jetstream.New(r.NC)
	if err != nil {
		return err
	}
	if strings.HasPrefix(stream, "subject:") {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if name, err := js.StreamNameBySubject(sctx, strings.TrimPrefix(stream, "subject:")); err == nil {
			stream = name
			r.waits.mu.Lock()
			r.waits.w.Stream = name
			r.waits.mu.Unlock()
		}
		cancel()
	}
	lastLog := time.Now()
	for {
		since, _ := r.link.down()
		switch {
		case !since.IsZero():
			if limit > 0 && time.Since(since) > limit {
				return fmt.Errorf("%w: %s unreachable for %s (the limit; --nats-unreachable-limit) while the job waited to resume: the next start restores the last committed checkpoint",
					ErrNATSUnreachable, r.link.url, time.Since(since).Round(time.Second))
			}
		case reason != WaitStreamFull:
			return nil
		default:
			if stream != "" && !strings.HasPrefix(stream, "subject:") {
				sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := js.Stream(sctx, stream)
				cancel()
				if errors.Is(err, jetstream.ErrStreamNotFound) {
					return fmt.Errorf("%w: %s was deleted while the job waited for room in it", engine.ErrStreamDeleted, stream)
				}
			}
			ok, why := hasRoom(ctx, js, stream)
			if ok {
				r.log.Info("broker: room again; resuming", "stream", stream, "room", why)
				return nil
			}
			if time.Since(lastLog) > 30*time.Second {
				r.log.Warn("broker: still waiting for room (back pressure: no record is dead-lettered for it)", "stream", stream, "state", why, "waiting", time.Since(r.waits.get().Since).Round(time.Second))
				lastLog = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%s %s): the next start restores the last committed checkpoint", ErrStoppedWaitingBroker, reason, stream)
		case <-time.After(time.Second):
		}
	}
}

// hasRoom reports whether the stream (or, for "", the account) has room
// again: a tenth of each limit free, or the limit gone; why says its state.
func hasRoom(ctx context.Context, js jetstream.JetStream, stream string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	room := func(used, limit int64) bool { return limit <= 0 || limit-used >= max(1, limit/10) }
	if stream != "" {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return false, err.Error()
		}
		info, err := st.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		c, s := info.Config, info.State
		why := fmt.Sprintf("%d of max_msgs %d, %d of max_bytes %d bytes", s.Msgs, c.MaxMsgs, s.Bytes, c.MaxBytes)
		if !room(int64(s.Msgs), c.MaxMsgs) || !room(int64(s.Bytes), c.MaxBytes) {
			return false, why
		}
		// The stream has room; the account must too.
		ok, awhy := accountRoom(ctx, js, room)
		return ok, why + "; " + awhy
	}
	return accountRoom(ctx, js, room)
}

func accountRoom(ctx context.Context, js jetstream.JetStream, room func(used, limit int64) bool) (bool, string) {
	a, err := js.AccountInfo(ctx)
	if err != nil {
		return false, err.Error()
	}
	why := fmt.Sprintf("account: %d of max_store %d, %d of max_memory %d bytes", a.Store, a.Limits.MaxStore, a.Memory, a.Limits.MaxMemory)
	return room(int64(a.Store), a.Limits.MaxStore) && room(int64(a.Memory), a.Limits.MaxMemory), why
}

// KeepListener shares one listener among the HTTP servers of successive
// runs: each Next is a listener whose Close ends only its own Accept, so
// that a run's server shutting down leaves the address bound for the next
// (a client connecting in between waits in the backlog). Close closes ln.
type KeepListener struct {
	ln    net.Listener
	conns chan net.Conn
	done  chan struct{}
}

// NewKeepListener accepts on ln for the listeners of Next.
func NewKeepListener(ln net.Listener) *KeepListener {
	k := &KeepListener{ln: ln, conns: make(chan net.Conn), done: make(chan struct{})}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(k.done)
				return
			}
			select {
			case k.conns <- c:
			case <-time.After(time.Minute):
				_ = c.Close() // no server took it
			}
		}
	}()
	return k
}

// Next is a listener for one run's server.
func (k *KeepListener) Next() net.Listener {
	return &genListener{k: k, closed: make(chan struct{})}
}

// Close closes the shared listener.
func (k *KeepListener) Close() error { return k.ln.Close() }

type genListener struct {
	k      *KeepListener
	closed chan struct{}
	once   sync.Once
}

func (g *genListener) Accept() (net.Conn, error) {
	select {
	case c := <-g.k.conns:
		return c, nil
	case <-g.closed:
		return nil, net.ErrClosed
	case <-g.k.done:
		return nil, net.ErrClosed
	}
}

func (g *genListener) Close() error {
	g.once.Do(func() { close(g.closed) })
	return nil
}

func (g *genListener) Addr() net.Addr { return g.k.ln.Addr() }

// inputReplicas is the replica count of a job's input streams (see
// engine.StreamReplicas): its repartition streams take it. It reads the
// job's inputs, not its running sub-topologies: a group member may run
// none of those that read them.
func inputReplicas(ctx context.Context, js jetstream.JetStream, j *job.Job) int {
	var names []string
	for _, in := range j.InputsOf() {
		switch {
		case in.Table != "":
			names = append(names, "KV_"+in.Table)
		case in.Nexmark == nil && in.Stream != "":
			names = append(names, in.Stream)
		}
	}
	return engine.StreamReplicas(ctx, js, names...)
}
