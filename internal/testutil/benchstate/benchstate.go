// Package benchstate builds and mutates the keyed state of a multi-slot job
// for the checkpoint and restore benchmarks: user keys of 11 decimal digits
// (so state.ValueKey is 16 bytes) and values of 100 random hex characters
// (Snappy barely compresses them, zstd about halves them).
package benchstate

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"cairn/internal/base/datadir"
	"cairn/state"
)

// The workload's shape.
const (
	UserKeyLen = 11
	ValueLen   = 100
	EntryLen   = 16 + ValueLen // encoded key + value bytes per key
	KeyGroups  = 128
	Batch      = 1000 // writes per batch commit
	Stage      = 1    // the keyed stage id the values are written under
)

// State is the state of a job of Slots slots, one Pebble DB each.
type State struct {
	Keys  int
	Slots int
	DBs   []*state.DB
	Seed  uint64
	Round uint64
}

// UserKey is key i's user key.
func UserKey(dst []byte, i int) []byte { return fmt.Appendf(dst[:0], "%0*d", UserKeyLen, i) }

// Open opens (or creates) the slot DBs dir(i) of a state of keys keys.
func Open(tb testing.TB, dir func(slot int) string, keys, slots int, readOnly bool) *State {
	s := &State{Keys: keys, Slots: slots, Seed: 42}
	for i := range slots {
		db, err := state.Open(dir(i), state.Options{KeyGroups: KeyGroups, Range: state.SlotRange(i, slots, KeyGroups), ReadOnly: readOnly})
		if err != nil {
			tb.Fatal(err)
		}
		s.DBs = append(s.DBs, db)
	}
	return s
}

// Build creates size bytes of keyed state in slot DBs under root/slot-<i>
// and returns it with the build time.
func Build(tb testing.TB, root string, size int64, slots int, seed uint64) (*State, time.Duration) {
	s := Open(tb, func(i int) string { return datadir.SlotIn(root, i) }, int(size/EntryLen), slots, false)
	s.Seed = seed
	d := s.Apply(tb, s.Keys, func(j int) int { return j })
	return s, d
}

// Apply writes new values for the keys idx(j), j < n, one goroutine per
// slot, each committing batches of Batch; every goroutine walks all keys and
// keeps its own slot's.
func (s *State) Apply(tb testing.TB, n int, idx func(j int) int) time.Duration {
	s.Round++
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, s.Slots)
	for slot := range s.Slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(s.Seed, s.Round<<8|uint64(slot)))
			b := s.DBs[slot].NewBatch()
			defer b.Close()
			var key []byte
			var raw [ValueLen / 2]byte
			val := make([]byte, ValueLen)
			for j := range n {
				key = UserKey(key, idx(j))
				kg := state.KeyGroup(key, KeyGroups)
				if state.SlotOf(kg, s.Slots, KeyGroups) != slot {
					continue
				}
				for k := 0; k < len(raw); k += 8 {
					x := rng.Uint64()
					for m := 0; m < 8 && k+m < len(raw); m++ {
						raw[k+m] = byte(x >> (8 * m))
					}
				}
				hex.Encode(val, raw[:])
				b.Put(Stage, kg, key, nil, val)
				if b.Len() >= Batch {
					if err := b.Commit(); err != nil {
						errs[slot] = err
						return
					}
					b.Reset()
				}
			}
			if b.Len() > 0 {
				errs[slot] = b.Commit()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	return time.Since(start)
}

// Update changes 1% of the keys, chosen at random.
func (s *State) Update(tb testing.TB) time.Duration { return s.UpdateN(tb, s.Keys/100) }

// UpdateN changes n keys, chosen at random.
func (s *State) UpdateN(tb testing.TB, n int) time.Duration {
	rng := rand.New(rand.NewPCG(s.Seed^0x5eed, s.Round))
	pick := make([]int, n)
	for j := range pick {
		pick[j] = rng.IntN(s.Keys)
	}
	return s.Apply(tb, len(pick), func(j int) int { return pick[j] })
}

// Snap is one slot's local checkpoint.
type Snap struct {
	Slot  int
	Range state.KeyGroupRange
	Dir   string
	// Sync is the pause: what the engine's slot waits for at the barrier
	// (state.DB.CheckpointBegin: the flush). Link is the rest (hard links,
	// metadata), which the engine runs beside processing.
	Sync, Link time.Duration
}

// Snapshot takes a local checkpoint of every slot, in parallel, under
// dir/slot-<i>, as the engine does: the pause, then the links.
func (s *State) Snapshot(tb testing.TB, dir string) []Snap {
	snaps := make([]Snap, s.Slots)
	errs := make([]error, s.Slots)
	var wg sync.WaitGroup
	for i, db := range s.DBs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sd := datadir.SlotIn(dir, i)
			t := time.Now()
			finish, err := db.CheckpointBegin()
			pause := time.Since(t)
			if err == nil {
				t = time.Now()
				err = finish(sd)
			}
			errs[i] = err
			snaps[i] = Snap{Slot: i, Range: db.Range(), Dir: sd, Sync: pause, Link: time.Since(t)}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	return snaps
}

// Get reads key i's value from the slot that owns it.
func (s *State) Get(tb testing.TB, i int) string {
	key := UserKey(nil, i)
	kg := state.KeyGroup(key, KeyGroups)
	v, ok, err := s.DBs[state.SlotOf(kg, s.Slots, KeyGroups)].Get(Stage, kg, key, nil)
	if err != nil || !ok {
		tb.Fatalf("key %d: found %v, err %v", i, ok, err)
	}
	return string(v)
}

// Close closes the slot DBs.
func (s *State) Close() {
	for _, db := range s.DBs {
		db.Close()
	}
}
