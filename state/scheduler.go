package state

import (
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Compactions wait while an online restore's files are remote
// (docs/RATIONALE.md, "Online restore").
//
// A restored DB usually carries compaction debt (L0 files the source had
// not compacted yet). Pebble starts paying it at open, and a compaction
// reads its inputs whole: through remote files that is a download of most
// of the state before the DB is even open (Pebble's open waits for the
// compactions it started; 7 s of a 1 GiB restore's open were that). So
// while any remote file is incomplete, gatedScheduler grants no compaction
// except a move (metadata only) or one whose score says the LSM is near
// stalling writes; when the download ends, its periodic granter starts the
// waiting ones. Otherwise it is Pebble's ConcurrencyLimitScheduler: it
// grants up to DB.GetAllowedWithoutPermission compactions.
type gatedScheduler struct {
	hold func() bool
	db   pebble.DBForCompaction
	stop chan struct{}
	mu   struct {
		sync.Mutex
		running      int
		unregistered bool
		granting     bool
		cond         *sync.Cond
	}
}

// urgentScore is the compaction score (L0: sublevels over
// L0CompactionThreshold) from which a compaction runs even while files are
// remote: at 32/128 that is three quarters of the way to stopping writes.
const urgentScore = 3

// movePriority is the priority Pebble gives a move compaction (a file
// re-levelled without being read).
const movePriority = 100

func newGatedScheduler(hold func() bool) *gatedScheduler {
	s := &gatedScheduler{hold: hold, stop: make(chan struct{})}
	s.mu.cond = sync.NewCond(&s.mu.Mutex)
	return s
}

var _ pebble.CompactionScheduler = (*gatedScheduler)(nil)

func (s *gatedScheduler) Register(_ int, db pebble.DBForCompaction) {
	s.db = db
	go s.periodicGranter()
}

func (s *gatedScheduler) Unregister() {
	close(s.stop)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.unregistered = true
	for s.mu.granting {
		s.mu.cond.Wait()
	}
}

// TrySchedule is called with the DB's mutex held: it must not call back
// into the DB beyond GetAllowedWithoutPermission. While held, it refuses;
// the granter decides then (it may look at the waiting compaction).
func (s *gatedScheduler) TrySchedule() (bool, pebble.CompactionGrantHandle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.unregistered || s.hold() {
		return false, nil
	}
	if s.db.GetAllowedWithoutPermission() > s.mu.running {
		s.mu.running++
		return true, s
	}
	return false, nil
}

func (s *gatedScheduler) Started()                                          {}
func (s *gatedScheduler) MeasureCPU(pebble.CompactionGoroutineKind)         {}
func (s *gatedScheduler) CumulativeStats(pebble.CompactionGrantHandleStats) {}

func (s *gatedScheduler) Done() {
	s.mu.Lock()
	s.mu.running--
	s.mu.Unlock()
	s.grant()
}

func (s *gatedScheduler) UpdateGetAllowedWithoutPermission() {}

// grant starts waiting compactions up to the allowed count (only moves and
// urgent ones while held).
func (s *gatedScheduler) grant() {
	s.mu.Lock()
	for s.mu.granting {
		s.mu.cond.Wait()
	}
	if s.mu.unregistered {
		s.mu.Unlock()
		return
	}
	toGrant := s.db.GetAllowedWithoutPermission() - s.mu.running
	if toGrant <= 0 {
		s.mu.Unlock()
		return
	}
	s.mu.granting = true
	s.mu.Unlock()
	held := s.hold()
	for ; toGrant > 0; toGrant-- {
		waiting, wc := s.db.GetWaitingCompaction()
		if !waiting || held && wc.Priority < movePriority && wc.Score < urgentScore {
			break
		}
		if !s.db.Schedule(s) {
			break
		}
		s.mu.Lock()
		s.mu.running++
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.mu.granting = false
	s.mu.cond.Broadcast()
	s.mu.Unlock()
}

// periodicGranter grants every 100 ms, as Pebble's scheduler does: that is
// also how the waiting compactions start once the download ends.
func (s *gatedScheduler) periodicGranter() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.grant()
		}
	}
}
