// Package group runs one job on several processes: the members of a group
// agree, through a JetStream KV bucket per job, on who is alive and who owns
// which key-group range of which sub-topology. It adds no consensus of its
// own: every change is a compare-and-set on a KV key (the bucket's stream is
// replicated by JetStream's Raft), leases are KV keys that expire by
// per-key TTL unless renewed, and one member at a time — the holder of the
// coordinator lease — writes the assignment.
//
// The bucket holds:
//
//	member.<id>   a member's lease (TTL): {"id", "leaving"}
//	coordinator   the coordinator lease (TTL): the holder's id
//	assignment    the Assignment (no TTL), written by the coordinator and by
//	              owners completing a handoff
//
// A member learns what it gains, must release, or has lost from Changes.
package group

import (
	"cairn/engine"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

var (
	// ErrConfig is a group configuration that cannot work.
	ErrConfig = errors.New("group: invalid config")
	// ErrNotMoving is a Release of key groups that are not this member's
	// or not asked to move.
	ErrNotMoving = errors.New("group: nothing to release")
	// ErrClosed is an operation on a member that has left or closed.
	ErrClosed = errors.New("group: member closed")
)

// Key names in the bucket.
const (
	keyAssignment  = "assignment"
	keyCoordinator = "coordinator"
	keyMemberPre   = "member."
)

// DefaultLeaseTTL is how long a lease lives without renewal. Renewals come
// every third of it, so two lost renewals in a row do not cost the lease.
const DefaultLeaseTTL = 10 * time.Second

var nameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Config is one member's view of its group.
type Config struct {
	// Job names the group: its bucket is "cairn-group-<Job>".
	Job string
	// Member is this member's id, unique in the group.
	Member string
	// SubTopologies are the parts of the job whose key groups are divided;
	// every member must be given the same.
	SubTopologies []SubTopology
	// LeaseTTL is the lease lifetime (default DefaultLeaseTTL; at least
	// one second, the server's TTL granularity).
	LeaseTTL time.Duration
	// Replicas of the bucket (default 1; 3 on a three-node cluster).
	Replicas int
	// Log receives membership events (default: discarded).
	Log *slog.Logger
}

// Bucket is the KV bucket of job's group.
func Bucket(job string) string { return "cairn-group-" + job }

func (c *Config) check() error {
	if !nameRe.MatchString(c.Job) {
		return fmt.Errorf("%w: job %q: want 1-64 of A-Z a-z 0-9 _ -", ErrConfig, c.Job)
	}
	if !nameRe.MatchString(c.Member) {
		return fmt.Errorf("%w: member %q: want 1-64 of A-Z a-z 0-9 _ -", ErrConfig, c.Member)
	}
	if len(c.SubTopologies) == 0 {
		return fmt.Errorf("%w: no sub-topologies", ErrConfig)
	}
	seen := map[string]bool{}
	for i, s := range c.SubTopologies {
		if s.Name == "" || seen[s.Name] {
			return fmt.Errorf("%w: sub-topology %d: name %q empty or repeated", ErrConfig, i, s.Name)
		}
		seen[s.Name] = true
		if s.KeyGroups <= 0 {
			return fmt.Errorf("%w: sub-topology %s: %d key groups", ErrConfig, s.Name, s.KeyGroups)
		}
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.LeaseTTL < time.Second {
		return fmt.Errorf("%w: lease TTL %v below one second", ErrConfig, c.LeaseTTL)
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Change is what a member must do after the assignment or its lease
// changed. Each Owned carries the epoch to fence the range's outputs with.
type Change struct {
	// Gained ranges are now this member's: restore and run them.
	Gained []Owned
	// Release ranges are still this member's but asked to move: checkpoint
	// them, stop, then call Member.Release.
	Release []Owned
	// Lost ranges are no longer this member's without a handoff (its lease
	// expired, or they were taken after it): stop them at once.
	Lost []Owned
}

func (c Change) empty() bool { return len(c.Gained)+len(c.Release)+len(c.Lost) == 0 }

type memberValue struct {
	ID      string `json:"id"`
	Leaving bool   `json:"leaving,omitempty"`
}

// kgKey is one key group of one sub-topology.
type kgKey struct {
	sub string
	kg  int
}

type releasedKG struct {
	epoch   uint64
	pending bool // the handoff's write is under way
}

type kgState struct {
	epoch     uint64
	releasing bool
}

// Member is one process's membership in a group. Its methods are safe for
// concurrent use.
type Member struct {
	cfg      Config
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	subject  string // the bucket's subject prefix, "$KV.<bucket>."
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
	changes  chan Change
	kick     chan struct{}
	recon    chan struct{}      // a release failed: compare ownership again
	pauseReq chan chan struct{} // tests: hold the loop until the channel closes

	mu      sync.Mutex
	queue   []Change
	qnotify chan struct{}
	have    map[kgKey]kgState // what was reported as owned
	// released key groups handed over (or being handed over) by Release:
	// not owned, even while the loop's view of the assignment still says
	// so, and not lost when it stops saying so.
	released map[kgKey]releasedKG
	// beforeWrite, if set, runs before each assignment write (tests use it
	// to force a conflicting write).
	beforeWrite func()
	leaving     bool
	closed      bool
	// events are the changes of what the member runs (the runner's),
	// numbered by eventSeq.
	events   []Event
	eventSeq uint64

	// Owned by the loop goroutine.
	memberRev   uint64
	leaseOK     bool
	lastRenew   time.Time
	coordRev    uint64
	coordRenew  time.Time // last renewal of the coordinator lease
	coordinator string    // holder seen through the watch ("" none)
	assign      Assignment
	assignRev   uint64
	members     map[string]memberValue // coordinator only: leases seen
	memberW     jetstream.KeyWatcher
	membersInit bool

	stats Stats
	// seenRev is the newest assignment revision the loop has seen: a read
	// older than it is a lagging replica's.
	seenRev atomic.Uint64
	// born is when the member was made; leaseSent, on the monotonic clock
	// since born, is when the last lease write that succeeded was sent
	// (the server's TTL runs from later than that).
	born      time.Time
	leaseSent atomic.Int64
}

// ErrLeaseLapsed is a publish refused by a member whose lease may have
// expired: no renewal sent within the lease TTL has succeeded (the member
// was paused, or cut off from NATS), so another member may own what it
// runs.
var ErrLeaseLapsed = errors.New("group: the member's lease may have expired")

// clock is the time since the member was made, on the monotonic clock
// (which runs on while the process is stopped).
func (m *Member) clock() time.Duration { return time.Since(m.born) }

// LeaseValid returns ErrLeaseLapsed (wrapped, with the time since the last
// renewal) once more than the lease TTL has passed since the last lease
// write that succeeded was sent: by then the server may have expired the
// lease and the group given this member's ranges to another. A member's
// engines ask it before every publish.
func (m *Member) LeaseValid() error {
	if since := m.clock() - time.Duration(m.leaseSent.Load()); since >= m.cfg.LeaseTTL {
		return fmt.Errorf("%w: last renewal sent %v ago, lease TTL %v", ErrLeaseLapsed, since.Round(time.Millisecond), m.cfg.LeaseTTL)
	}
	return nil
}

// Stats counts the KV operations a member made (for measuring the group's
// load on the cluster).
type Stats struct {
	Writes, Reads, WatchUpdates, Conflicts uint64
}

// Join creates the job's bucket if needed, registers this member's lease
// and starts its heartbeat and watches. The member runs until Leave or
// Close.
func Join(ctx context.Context, js jetstream.JetStream, cfg Config) (*Member, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	kv, err := openBucket(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	m := &Member{
		cfg:      cfg,
		js:       js,
		kv:       kv,
		subject:  "$KV." + Bucket(cfg.Job) + ".",
		done:     make(chan struct{}),
		changes:  make(chan Change),
		kick:     make(chan struct{}, 1),
		recon:    make(chan struct{}, 1),
		pauseReq: make(chan chan struct{}),
		qnotify:  make(chan struct{}, 1),
		have:     map[kgKey]kgState{},
		released: map[kgKey]releasedKG{},
	}
	m.born = time.Now()
	m.ctx, m.cancel = context.WithCancel(context.Background())
	if err := m.register(ctx); err != nil {
		m.cancel()
		return nil, err
	}
	w, err := watchRetrying(ctx, cfg, func() (jetstream.KeyWatcher, error) {
		return kv.WatchFiltered(m.ctx, []string{keyAssignment, keyCoordinator})
	})
	if err != nil {
		m.cancel()
		return nil, fmt.Errorf("group: watch %s: %w", Bucket(cfg.Job), err)
	}
	go m.forward()
	go m.loop(w)
	return m, nil
}

// watchTries bounds watchRetrying: each try waits for the JetStream API's
// default timeout (5 s).
const watchTries = 12

// watchRetrying starts a watch, trying again while its consumer's creation
// goes unanswered: on a replicated bucket just created, or a cluster
// electing a leader or loaded, the request can time out though the next
// one succeeds. It gives up after watchTries, or when ctx ends.
func watchRetrying(ctx context.Context, cfg Config, start func() (jetstream.KeyWatcher, error)) (jetstream.KeyWatcher, error) {
	var err error
	for range watchTries {
		var w jetstream.KeyWatcher
		if w, err = start(); err == nil {
			return w, nil
		}
		if !errors.Is(err, context.DeadlineExceeded) && !transient(err) {
			return nil, err
		}
		cfg.Log.Debug("group: watch not started, trying again", "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil, err
}

// openBucket opens the group's bucket, creating it if needed. Each try is
// bounded by a few seconds and retried until ctx ends: on a cluster that
// is starting, or electing the new stream's leader, an API request can go
// unanswered.
//
// A create the cluster cannot place for want of peers is tried again for
// up to engine.PlacementWait, with a warning: the meta leader counts a
// node offline for a moment when its heartbeats come late (a loaded
// machine), or while it restarts.
func openBucket(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.KeyValue, error) {
	var noPeersSince time.Time
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		kv, err := openBucketOnce(tctx, js, cfg)
		cancel()
		if engine.NoPeers(err) {
			if noPeersSince.IsZero() {
				noPeersSince = time.Now()
				cfg.Log.Warn("group: the NATS cluster cannot place the group's bucket yet, waiting for its peers", "replicas", cfg.Replicas, "wait", engine.PlacementWait, "err", err)
			} else if time.Since(noPeersSince) > engine.PlacementWait {
				return nil, err
			}
		}
		// Just created, a bucket may not be known yet to the server a
		// lookup reaches, nor have a leader.
		if err == nil || ctx.Err() != nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrBucketNotFound) || transient(err) || engine.NoPeers(err)) {
			return kv, err
		}
		cfg.Log.Debug("group: bucket not ready, trying again", "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func openBucketOnce(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.KeyValue, error) {
	name := Bucket(cfg.Job)
	kv, err := js.KeyValue(ctx, name)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("group: bucket %s: look up: %w", name, err)
	}
	// The bucket's stream is created as the KV layer would create it,
	// plus atomic batches (the coordinator writes its lease and the
	// assignment in one), in one request: members that start together
	// all create it with the same config, which the server takes as one
	// create. (Creating a KV bucket, then updating its stream to allow
	// atomic batches, hangs on a cluster when another member's create of
	// the same bucket is under way.)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:                   "KV_" + name,
		Description:            "cairn group of job " + cfg.Job,
		Subjects:               []string{"$KV." + name + ".>"},
		MaxMsgsPerSubject:      1,
		MaxBytes:               -1,
		MaxMsgSize:             -1,
		Storage:                jetstream.FileStorage,
		Replicas:               cfg.Replicas,
		AllowRollup:            true,
		DenyDelete:             true,
		Duplicates:             2 * time.Minute,
		MaxMsgs:                -1,
		MaxConsumers:           -1,
		AllowDirect:            true,
		Discard:                jetstream.DiscardNew,
		AllowMsgTTL:            true,
		SubjectDeleteMarkerTTL: cfg.LeaseTTL,
		AllowAtomicPublish:     true,
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil, fmt.Errorf("group: bucket %s: create (%d replicas): %w", name, cfg.Replicas, err)
	}
	if kv, err = js.KeyValue(ctx, name); err != nil {
		return nil, fmt.Errorf("group: bucket %s: open: %w", name, err)
	}
	// A bucket made by an earlier version (or by hand) without atomic
	// batches gets them.
	s, err := js.Stream(ctx, "KV_"+name)
	if err != nil {
		return nil, fmt.Errorf("group: bucket %s: stream info: %w", name, err)
	}
	if cfg := s.CachedInfo().Config; !cfg.AllowAtomicPublish {
		cfg.AllowAtomicPublish = true
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return nil, fmt.Errorf("group: bucket %s: allow atomic batches: %w", name, err)
		}
	}
	return kv, nil
}

// ID is the member's id.
func (m *Member) ID() string { return m.cfg.Member }

// Changes delivers what the member gains, must release and has lost, in
// order. Nothing is dropped while the reader is slow: changes queue up.
// The channel closes when the member has left or closed.
func (m *Member) Changes() <-chan Change { return m.changes }

// Owned is what the member currently owns (as last reported on Changes).
func (m *Member) Owned() []Owned {
	m.mu.Lock()
	defer m.mu.Unlock()
	return toRanges(m.have, m.cfg.SubTopologies, nil)
}

// IsCoordinator reports whether the member holds the coordinator lease.
func (m *Member) IsCoordinator() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.coordRev != 0
}

// Stats is the member's KV operation count so far.
func (m *Member) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

func (m *Member) count(f func(*Stats)) {
	m.mu.Lock()
	f(&m.stats)
	m.mu.Unlock()
}

// register creates the member's lease, or takes over its own lease still
// alive from before (a member that thought it lost its lease while the
// server kept it).
// transient is an error of a stream with no leader at the moment (just
// created, or electing one): worth trying again.
func transient(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout)
}

func (m *Member) register(ctx context.Context) error {
	key := keyMemberPre + m.cfg.Member
	v, _ := json.Marshal(memberValue{ID: m.cfg.Member, Leaving: m.isLeaving()})
	for range 50 {
		m.count(func(s *Stats) { s.Writes++ })
		sent := m.clock()
		rev, err := m.kv.Create(ctx, key, v, jetstream.KeyTTL(m.cfg.LeaseTTL))
		if err == nil {
			m.memberRev, m.leaseOK, m.lastRenew = rev, true, time.Now()
			m.leaseSent.Store(int64(sent))
			m.cfg.Log.Info("group: joined", "member", m.cfg.Member, "revision", rev)
			return nil
		}
		if transient(err) {
			// A bucket just created on a cluster answers once its
			// stream's leader is elected.
			select {
			case <-ctx.Done():
				return fmt.Errorf("group: register %s: %w", key, err)
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("group: register %s: %w", key, err)
		}
		m.count(func(s *Stats) { s.Reads++ })
		e, gerr := m.kv.Get(ctx, key)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) {
			continue
		}
		if gerr != nil {
			return fmt.Errorf("group: register %s: %w", key, gerr)
		}
		sent = m.clock()
		rev, err = m.casTTL(ctx, key, v, e.Revision())
		if err == nil {
			m.memberRev, m.leaseOK, m.lastRenew = rev, true, time.Now()
			m.leaseSent.Store(int64(sent))
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("group: register %s: %w", key, err)
		}
	}
	return fmt.Errorf("group: register %s: %w", key, jetstream.ErrKeyRevisionMismatch)
}

// casTTL writes key = value if its last revision is rev, with the lease
// TTL. KeyValue.Update takes no TTL, so this publishes to the key's subject
// with the same expectation header Update uses.
func (m *Member) casTTL(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	m.count(func(s *Stats) { s.Writes++ })
	msg := &nats.Msg{Subject: m.subject + key, Header: nats.Header{}, Data: value}
	ack, err := m.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(m.cfg.LeaseTTL))
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			m.count(func(s *Stats) { s.Conflicts++ })
			return 0, fmt.Errorf("group: %s at revision %d: %w: %w", key, rev, jetstream.ErrKeyRevisionMismatch, err)
		}
		return 0, fmt.Errorf("group: %s: %w", key, err)
	}
	return ack.Sequence, nil
}

func (m *Member) isLeaving() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leaving
}

// forward hands queued changes to the reader without ever blocking the
// loop (a slow reader must not stop the heartbeat).
func (m *Member) forward() {
	defer close(m.changes)
	for {
		m.mu.Lock()
		var c Change
		ok := len(m.queue) > 0
		if ok {
			c = m.queue[0]
			m.queue = m.queue[1:]
		}
		m.mu.Unlock()
		if !ok {
			select {
			case <-m.qnotify:
				continue
			case <-m.done:
				return
			}
		}
		select {
		case m.changes <- c:
		case <-m.done:
			return
		}
	}
}

func (m *Member) emit(c Change) {
	if c.empty() {
		return
	}
	m.mu.Lock()
	m.queue = append(m.queue, c)
	m.mu.Unlock()
	select {
	case m.qnotify <- struct{}{}:
	default:
	}
}

func (m *Member) loop(w jetstream.KeyWatcher) {
	defer close(m.done)
	defer func() {
		w.Stop()
		if m.memberW != nil {
			m.memberW.Stop()
		}
	}()
	hb := time.NewTicker(m.cfg.LeaseTTL / 3)
	defer hb.Stop()
	var memberUpdates <-chan jetstream.KeyValueEntry
	for {
		if m.memberW != nil {
			memberUpdates = m.memberW.Updates()
		} else {
			memberUpdates = nil
		}
		select {
		case <-m.ctx.Done():
			return
		case resume := <-m.pauseReq:
			<-resume
		case <-hb.C:
			m.heartbeat()
		case <-m.kick:
			m.coordinate()
		case <-m.recon:
			m.reconcile()
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			m.watched(e)
		case e, ok := <-memberUpdates:
			if !ok {
				m.memberW = nil
				continue
			}
			m.memberSeen(e)
		}
	}
}

func (m *Member) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(m.ctx, max(m.cfg.LeaseTTL/3, 2*time.Second))
}

// heartbeat renews the member's lease and, if held, the coordinator's;
// takes the coordinator lease when nobody holds it; and, as coordinator,
// rebalances.
func (m *Member) heartbeat() {
	ctx, cancel := m.opCtx()
	defer cancel()
	key := keyMemberPre + m.cfg.Member
	if m.memberRev == 0 {
		if err := m.register(ctx); err != nil {
			m.cfg.Log.Warn("group: rejoin", "member", m.cfg.Member, "err", err)
			return
		}
		m.reconcile()
	} else {
		v, _ := json.Marshal(memberValue{ID: m.cfg.Member, Leaving: m.isLeaving()})
		sent := m.clock()
		rev, err := m.casTTL(ctx, key, v, m.memberRev)
		switch {
		case err == nil:
			m.memberRev, m.lastRenew = rev, time.Now()
			m.leaseSent.Store(int64(sent))
			if !m.leaseOK {
				m.leaseOK = true
				m.reconcile()
			}
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			if rev, ok := m.ownRevision(ctx, key, v); ok {
				// An earlier renewal went through unacknowledged.
				m.memberRev, m.lastRenew = rev, time.Now()
				break
			}
			// The lease expired (a marker is the key's last message):
			// everything owned is lost.
			m.cfg.Log.Warn("group: lease lost", "member", m.cfg.Member, "err", err)
			m.loseLease()
			return
		default:
			m.cfg.Log.Debug("group: renew", "member", m.cfg.Member, "err", err)
			if time.Since(m.lastRenew) >= m.cfg.LeaseTTL {
				// Not renewed for a whole TTL: the others may have taken
				// over, so stop as if lost (renewal resumes it if not).
				m.cfg.Log.Warn("group: lease unconfirmed", "member", m.cfg.Member, "err", err)
				m.leaseOK = false
				m.reconcile()
			}
			return
		}
	}
	m.coordinatorLease(ctx)
	m.coordinate()
}

// ownRevision tells a renewal refused because an earlier one went through
// unacknowledged (the key still holds what this member writes: it is the
// only writer of that value) from a lease that expired or was taken; it
// returns the key's revision in the first case.
func (m *Member) ownRevision(ctx context.Context, key string, value []byte) (uint64, bool) {
	m.count(func(s *Stats) { s.Reads++ })
	e, err := m.kv.Get(ctx, key)
	if err != nil || e.Operation() != jetstream.KeyValuePut || string(e.Value()) != string(value) {
		return 0, false
	}
	return e.Revision(), true
}

func (m *Member) loseLease() {
	m.memberRev, m.leaseOK = 0, false
	m.dropCoordinator()
	m.reconcile()
}

func (m *Member) coordinatorLease(ctx context.Context) {
	v := []byte(m.cfg.Member)
	if m.coordRev != 0 {
		rev, err := m.casTTL(ctx, keyCoordinator, v, m.coordRev)
		if err == nil {
			m.setCoordRev(rev)
			return
		}
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			if rev, ok := m.ownRevision(ctx, keyCoordinator, v); ok {
				m.setCoordRev(rev)
				return
			}
			m.cfg.Log.Warn("group: coordinator lease lost", "member", m.cfg.Member)
			m.dropCoordinator()
		}
		return
	}
	if m.coordinator != "" || m.isLeaving() {
		return
	}
	m.count(func(s *Stats) { s.Writes++ })
	rev, err := m.kv.Create(ctx, keyCoordinator, v, jetstream.KeyTTL(m.cfg.LeaseTTL))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			m.count(func(s *Stats) { s.Conflicts++ })
		} else {
			m.cfg.Log.Debug("group: take coordinator lease", "member", m.cfg.Member, "err", err)
		}
		return
	}
	m.cfg.Log.Info("group: coordinator", "member", m.cfg.Member, "revision", rev)
	m.setCoordRev(rev)
	m.coordinator = m.cfg.Member
	w, err := m.kv.Watch(m.ctx, keyMemberPre+">")
	if err != nil {
		m.cfg.Log.Warn("group: watch members", "err", err)
		m.dropCoordinator()
		return
	}
	m.memberW, m.members, m.membersInit = w, map[string]memberValue{}, false
}

func (m *Member) setCoordRev(rev uint64) {
	if rev != 0 {
		m.coordRenew = time.Now()
	}
	m.mu.Lock()
	m.coordRev = rev
	m.mu.Unlock()
}

func (m *Member) dropCoordinator() {
	m.setCoordRev(0)
	if m.coordinator == m.cfg.Member {
		m.coordinator = ""
	}
	if m.memberW != nil {
		m.memberW.Stop()
		m.memberW = nil
	}
	m.members = nil
}

// memberSeen updates the coordinator's view of the leases.
func (m *Member) memberSeen(e jetstream.KeyValueEntry) {
	if e == nil {
		m.membersInit = true
		m.coordinate()
		return
	}
	m.count(func(s *Stats) { s.WatchUpdates++ })
	id := e.Key()[len(keyMemberPre):]
	switch e.Operation() {
	case jetstream.KeyValuePut:
		var v memberValue
		if json.Unmarshal(e.Value(), &v) != nil {
			return
		}
		old, ok := m.members[id]
		m.members[id] = v
		if ok && old == v {
			return // a renewal
		}
	default:
		delete(m.members, id)
	}
	if m.membersInit {
		m.coordinate()
	}
}

// coordinate writes a rebalanced assignment when it differs from the
// current one. Only the coordinator does, after its view of the members is
// complete, and only while its coordinator lease was renewed within half
// the TTL (a coordinator that stalled longer renews first, or learns it
// lost the lease).
func (m *Member) coordinate() {
	if m.coordRev == 0 || !m.membersInit || !m.leaseOK {
		return
	}
	if time.Since(m.coordRenew) > m.cfg.LeaseTTL/2 {
		return // the next heartbeat renews, then coordinates
	}
	var members []string
	alive := map[string]bool{}
	for id, v := range m.members {
		alive[id] = true
		if !v.Leaving {
			members = append(members, id)
		}
	}
	next := Rebalance(m.cfg.SubTopologies, members, alive, m.assign)
	if next.equal(m.assign) && m.assignRev != 0 {
		return
	}
	if len(next.Ranges) == 0 {
		return
	}
	ctx, cancel := m.opCtx()
	defer cancel()
	b, _ := json.Marshal(next)
	var rev uint64
	var err error
	m.count(func(s *Stats) { s.Writes++ })
	if m.beforeWrite != nil {
		m.beforeWrite()
	}
	rev, err = m.writeAsCoordinator(ctx, b)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			m.count(func(s *Stats) { s.Conflicts++ })
			m.cfg.Log.Debug("group: assignment write conflicted", "member", m.cfg.Member, "err", err)
			if _, still := m.ownRevision(ctx, keyCoordinator, []byte(m.cfg.Member)); !still {
				m.cfg.Log.Warn("group: coordinator lease lost", "member", m.cfg.Member)
				m.dropCoordinator()
				return
			}
			// Someone (an owner completing a handoff) wrote first: the
			// watch brings the newer value, then this runs again.
			m.refreshAssignment(ctx)
			m.kickSoon()
			return
		}
		m.cfg.Log.Warn("group: write assignment", "err", err)
		return
	}
	m.cfg.Log.Info("group: assignment", "coordinator", m.cfg.Member, "revision", rev, "members", len(members))
	m.setAssignment(next, rev)
}

// writeAsCoordinator renews the coordinator lease and writes the
// assignment in one atomic batch, each expecting its key's revision: the
// write happens only if this member still holds the lease and nobody wrote
// the assignment since it read it. A coordinator that stalled after its
// last renewal (its lease since expired or taken) cannot write a plan made
// from a stale view.
func (m *Member) writeAsCoordinator(ctx context.Context, assignment []byte) (uint64, error) {
	lease := &nats.Msg{Subject: m.subject + keyCoordinator, Header: nats.Header{}, Data: []byte(m.cfg.Member)}
	lease.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(m.coordRev, 10))
	lease.Header.Set(jetstream.MsgTTLHeader, m.cfg.LeaseTTL.String())
	plan := &nats.Msg{Subject: m.subject + keyAssignment, Header: nats.Header{}, Data: assignment}
	plan.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(m.assignRev, 10))
	ack, err := jetstreamext.PublishMsgBatch(ctx, m.js, []*nats.Msg{lease, plan})
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return 0, fmt.Errorf("group: write assignment at revision %d as coordinator at %d: %w: %w", m.assignRev, m.coordRev, jetstream.ErrKeyRevisionMismatch, err)
		}
		return 0, fmt.Errorf("group: write assignment: %w", err)
	}
	// The batch is stored contiguously: the lease, then the assignment.
	m.setCoordRev(ack.Sequence - 1)
	return ack.Sequence, nil
}

func (m *Member) kickSoon() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// refreshAssignment reads the assignment (after a conflict, not to wait
// for the watch).
func (m *Member) refreshAssignment(ctx context.Context) {
	m.count(func(s *Stats) { s.Reads++ })
	e, err := m.kv.Get(ctx, keyAssignment)
	if err != nil {
		return
	}
	var a Assignment
	if json.Unmarshal(e.Value(), &a) == nil && e.Revision() > m.assignRev {
		m.setAssignment(a, e.Revision())
	}
}

func (m *Member) setAssignment(a Assignment, rev uint64) {
	if rev < m.assignRev {
		return
	}
	m.assign, m.assignRev = a, rev
	if rev > m.seenRev.Load() {
		m.seenRev.Store(rev)
	}
	m.reconcile()
}

// watched handles a change of the assignment or the coordinator lease.
func (m *Member) watched(e jetstream.KeyValueEntry) {
	if e == nil {
		return
	}
	m.count(func(s *Stats) { s.WatchUpdates++ })
	switch e.Key() {
	case keyCoordinator:
		if e.Operation() == jetstream.KeyValuePut {
			m.coordinator = string(e.Value())
			if m.coordinator != m.cfg.Member && m.coordRev != 0 {
				m.dropCoordinator()
			}
		} else {
			m.coordinator = ""
			if m.coordRev != 0 {
				m.dropCoordinator()
			}
			if m.leaseOK && !m.isLeaving() {
				// Take over now rather than at the next heartbeat.
				ctx, cancel := m.opCtx()
				m.coordinatorLease(ctx)
				cancel()
			}
		}
	case keyAssignment:
		if e.Operation() != jetstream.KeyValuePut {
			return
		}
		var a Assignment
		if err := json.Unmarshal(e.Value(), &a); err != nil {
			m.cfg.Log.Warn("group: bad assignment", "revision", e.Revision(), "err", err)
			return
		}
		m.setAssignment(a, e.Revision())
		m.coordinate()
	}
}

// reconcile compares what the member should own (the assignment's ranges
// for it, nothing without a lease) with what it reported, and emits the
// difference.
func (m *Member) reconcile() {
	want := map[kgKey]kgState{}
	if m.leaseOK {
		for _, o := range m.assign.Of(m.cfg.Member) {
			for kg := o.Lo; kg < o.Hi; kg++ {
				want[kgKey{o.Sub, kg}] = kgState{epoch: o.Epoch, releasing: o.Next != ""}
			}
		}
	}
	gained, release, lost := map[kgKey]kgState{}, map[kgKey]kgState{}, map[kgKey]kgState{}
	m.mu.Lock()
	for k, r := range m.released {
		if w, ok := want[k]; r.pending || ok && w.epoch == r.epoch {
			delete(want, k)
		} else {
			delete(m.released, k)
		}
	}
	for k, w := range want {
		h, ok := m.have[k]
		if !ok || h.epoch != w.epoch {
			if ok {
				lost[k] = h
			}
			gained[k] = kgState{epoch: w.epoch}
		}
		if w.releasing && (!ok || !h.releasing || h.epoch != w.epoch) {
			release[k] = w
		}
	}
	for k, h := range m.have {
		if _, ok := want[k]; !ok {
			lost[k] = h
		}
	}
	m.have = want
	m.mu.Unlock()
	subs := m.cfg.SubTopologies
	if len(gained)+len(release)+len(lost) > 0 {
		m.cfg.Log.Debug("group: change", "member", m.cfg.Member, "gained", len(gained), "release", len(release), "lost", len(lost), "assignment", m.assignRev, "lease", m.leaseOK)
	}
	m.emit(Change{Lost: toRanges(lost, subs, nil), Gained: toRanges(gained, subs, nil), Release: toRanges(release, subs, m.assign.nextOf)})
}

// nextOf is the member key group k moves to in a ("" none).
func (a Assignment) nextOf(sub string, kg int) string {
	for _, o := range a.Ranges {
		if o.Sub == sub && kg >= o.Lo && kg < o.Hi {
			return o.Next
		}
	}
	return ""
}

// toRanges groups key groups into maximal ranges of equal epoch (and next,
// when next is given).
func toRanges(set map[kgKey]kgState, subs []SubTopology, next func(string, int) string) []Owned {
	var out []Owned
	for _, sub := range subs {
		var cur *Owned
		for kg := range sub.KeyGroups {
			s, ok := set[kgKey{sub.Name, kg}]
			n := ""
			if ok && next != nil {
				n = next(sub.Name, kg)
			}
			if ok && cur != nil && cur.Hi == kg && cur.Epoch == s.epoch && cur.Next == n {
				cur.Hi++
				continue
			}
			if cur != nil {
				out = append(out, *cur)
				cur = nil
			}
			if ok {
				cur = &Owned{Range: Range{Sub: sub.Name, Lo: kg, Hi: kg + 1}, Epoch: s.epoch, Next: n}
			}
		}
		if cur != nil {
			out = append(out, *cur)
		}
	}
	return out
}

// Release completes the handoff of the key groups of r that this member
// owns and was asked to move: call it once their state is checkpointed and
// nothing more will be published for them. They go to their next owner
// under a new epoch. Conflicting writes to the assignment are retried.
func (m *Member) Release(ctx context.Context, r Range) error {
	select {
	case <-m.done:
		return ErrClosed
	default:
	}
	for attempt := 0; ; attempt++ {
		m.count(func(s *Stats) { s.Reads++ })
		e, err := m.kv.Get(ctx, keyAssignment)
		if err != nil {
			m.askAgain(r)
			return fmt.Errorf("group: release %v: %w", r, err)
		}
		var a Assignment
		if err := json.Unmarshal(e.Value(), &a); err != nil {
			m.askAgain(r)
			return fmt.Errorf("group: release %v: assignment revision %d: %w", r, e.Revision(), err)
		}
		next, moved := handOver(m.cfg.SubTopologies, a, m.cfg.Member, r)
		if moved == 0 && e.Revision() < m.seenRev.Load() {
			// A read served by a replica behind the one whose watch asked
			// for this release (KV reads on a clustered bucket may come
			// from any replica): read again until it caught up.
			select {
			case <-ctx.Done():
				m.askAgain(r)
				return fmt.Errorf("group: release %v: assignment read at revision %d, behind %d: %w", r, e.Revision(), m.seenRev.Load(), ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		if moved == 0 {
			return fmt.Errorf("%w: %v by %s", ErrNotMoving, r, m.cfg.Member)
		}
		// Mark the key groups released before the write: the watch may
		// bring the new assignment before Update returns.
		var moving []kgKey
		m.mu.Lock()
		for _, o := range a.Of(m.cfg.Member) {
			if o.Sub != r.Sub || o.Next == "" {
				continue
			}
			for kg := max(o.Lo, r.Lo); kg < min(o.Hi, r.Hi); kg++ {
				k := kgKey{r.Sub, kg}
				moving = append(moving, k)
				m.released[k] = releasedKG{epoch: o.Epoch, pending: true}
				delete(m.have, k)
			}
		}
		m.mu.Unlock()
		settle := func(ok bool) {
			m.mu.Lock()
			defer m.mu.Unlock()
			for _, k := range moving {
				rel := m.released[k]
				if ok {
					m.released[k] = releasedKG{epoch: rel.epoch}
				} else {
					// Not released: asked again at the next comparison.
					delete(m.released, k)
					m.have[k] = kgState{epoch: rel.epoch}
				}
			}
			if !ok {
				// Compare again with the latest assignment: it asks for
				// the release again, or, if the write went through
				// unacknowledged (the watch then already brought it),
				// reports the key groups lost.
				select {
				case m.recon <- struct{}{}:
				default:
				}
			}
		}
		b, _ := json.Marshal(next)
		m.count(func(s *Stats) { s.Writes++ })
		if m.beforeWrite != nil {
			m.beforeWrite()
		}
		_, err = m.kv.Update(ctx, keyAssignment, b, e.Revision())
		settle(err == nil)
		if err == nil {
			m.cfg.Log.Info("group: released", "member", m.cfg.Member, "range", r.String(), "key_groups", moved)
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("group: release %v: %w", r, err)
		}
		m.count(func(s *Stats) { s.Conflicts++ })
		if attempt > 100 {
			return fmt.Errorf("group: release %v: %w after %d attempts", r, err, attempt)
		}
	}
}

// askAgain makes the next comparison ask for the release of r again: a
// release that failed before its write (the assignment could not be read)
// must not leave the key groups marked as asked, or the handoff would wait
// for a Release nobody calls.
func (m *Member) askAgain(r Range) {
	m.mu.Lock()
	for k, h := range m.have {
		if k.sub == r.Sub && k.kg >= r.Lo && k.kg < r.Hi && h.releasing {
			h.releasing = false
			m.have[k] = h
		}
	}
	m.mu.Unlock()
	select {
	case m.recon <- struct{}{}:
	default:
	}
}

// Leave hands every range over and leaves: the member's lease is marked
// leaving, the coordinator moves its ranges to the others (the caller
// checkpoints each Release and calls Release, as for any handoff), and once
// it owns nothing (or no other member is alive to take over) its leases are
// deleted and the member stops.
func (m *Member) Leave(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	m.leaving = true
	m.mu.Unlock()
	key := keyMemberPre + m.cfg.Member
	for {
		owns, err := m.ownsAny(ctx)
		if err != nil {
			return err
		}
		others, err := m.othersAlive(ctx)
		if err != nil {
			return err
		}
		if !owns || !others {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("group: leave %s: %w", m.cfg.Member, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	// Stop the loop first so no renewal races the deletes.
	m.shutdown()
	if err := m.kv.Delete(ctx, key); err != nil {
		return fmt.Errorf("group: leave %s: %w", m.cfg.Member, err)
	}
	if m.coordRev != 0 {
		// Only if still ours: another may hold it already.
		if err := m.kv.Delete(ctx, keyCoordinator, jetstream.LastRevision(m.coordRev)); err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("group: leave %s: resign coordinator: %w", m.cfg.Member, err)
		}
	}
	m.cfg.Log.Info("group: left", "member", m.cfg.Member)
	return nil
}

func (m *Member) ownsAny(ctx context.Context) (bool, error) {
	e, err := m.kv.Get(ctx, keyAssignment)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("group: leave %s: %w", m.cfg.Member, err)
	}
	var a Assignment
	if err := json.Unmarshal(e.Value(), &a); err != nil {
		return false, fmt.Errorf("group: leave %s: assignment revision %d: %w", m.cfg.Member, e.Revision(), err)
	}
	return len(a.Of(m.cfg.Member)) > 0, nil
}

func (m *Member) othersAlive(ctx context.Context) (bool, error) {
	keys, err := m.kv.ListKeysFiltered(ctx, keyMemberPre+">")
	if err != nil {
		return false, fmt.Errorf("group: leave %s: members: %w", m.cfg.Member, err)
	}
	others := false
	for k := range keys.Keys() {
		if k != keyMemberPre+m.cfg.Member {
			others = true
		}
	}
	return others, nil
}

// Close stops the member abruptly, as a crash would: nothing is handed
// over or deleted, its leases expire by TTL and the others take its ranges.
func (m *Member) Close() {
	m.shutdown()
}

func (m *Member) shutdown() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	<-m.done
}

// Epoch is the epoch under which this member owns key group kg of sub
// (what its outputs are fenced with); false if it does not own it.
func (m *Member) Epoch(sub string, kg int) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.have[kgKey{sub, kg}]
	return s.epoch, ok
}

func decodeAssignment(b []byte) (Assignment, error) {
	var a Assignment
	if err := json.Unmarshal(b, &a); err != nil {
		return Assignment{}, fmt.Errorf("group: assignment: %w", err)
	}
	return a, nil
}
