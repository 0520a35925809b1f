package state

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"
)

// TestValueCacheEqualsTheDB runs one random sequence of writes, batches
// committed and batches dropped, TTL expiry and sweeps, checkpoint barriers
// (the hold) and their finish, on a DB with a small value cache (so it
// sheds entries) and on one without; after every step every key reads the
// same from both.
func TestValueCacheEqualsTheDB(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	clock := newFakeClock()
	root := t.TempDir()
	open := func(name string, cacheBytes int) *DB {
		o := testOptions()
		o.Now = clock.Now
		o.TTL = map[uint8]time.Duration{2: 50 * time.Millisecond}
		o.ValueCacheBytes = cacheBytes
		return openDB(t, filepath.Join(root, name), o)
	}
	cached, plain := open("cached", 4<<10), open("plain", -1)
	if cached.cache == nil || plain.cache != nil {
		t.Fatal("cache settings not applied")
	}
	dbs := []*DB{cached, plain}
	const keys = 200
	key := func(i int) (stage uint8, kg int, user []byte) {
		return uint8(1 + i%2), i % testKGs, []byte(fmt.Sprintf("k%03d", i))
	}
	var finishes []func(string) error
	check := func(step int, what string) {
		t.Helper()
		for i := range keys {
			stage, kg, user := key(i)
			a, aok := mustGet(t, cached, stage, kg, string(user), "")
			b, bok := mustGet(t, plain, stage, kg, string(user), "")
			if a != b || aok != bok {
				t.Fatalf("step %d (%s), key %d: cached %q %v, plain %q %v", step, what, i, a, aok, b, bok)
			}
		}
	}
	for step := range 400 {
		var what string
		switch r := rng.IntN(10); {
		case r < 5: // a batch of writes, committed or dropped
			commit := rng.IntN(4) > 0
			what = fmt.Sprintf("batch (commit %v)", commit)
			ops := make([][3]int, 1+rng.IntN(20))
			for j := range ops {
				ops[j] = [3]int{rng.IntN(keys), rng.IntN(3), rng.IntN(1000)}
			}
			for _, d := range dbs {
				b := d.NewBatch()
				for _, op := range ops {
					stage, kg, user := key(op[0])
					if op[1] == 0 {
						b.Delete(stage, kg, user, nil)
					} else {
						b.Put(stage, kg, user, nil, []byte(fmt.Sprintf("v%d", op[2])))
					}
				}
				if commit {
					if err := b.Commit(); err != nil {
						t.Fatal(err)
					}
				}
				b.Close()
			}
		case r < 7:
			what = "time passes"
			clock.Advance(time.Duration(rng.IntN(40)) * time.Millisecond)
		case r < 8:
			what = "sweep"
			for _, d := range dbs {
				if _, err := d.SweepExpired(1 + rng.IntN(50)); err != nil {
					t.Fatal(err)
				}
			}
		case r < 9:
			what = "barrier"
			if len(finishes) > 0 {
				break // one checkpoint at a time, as the engine
			}
			for _, d := range dbs {
				f, err := d.CheckpointBegin()
				if err != nil {
					t.Fatal(err)
				}
				finishes = append(finishes, f)
			}
		default:
			what = "checkpoint captured"
			for i, f := range finishes {
				if err := f(filepath.Join(root, fmt.Sprintf("chk-%d-%d", step, i))); err != nil {
					t.Fatal(err)
				}
			}
			finishes = nil
		}
		check(step, what)
	}
	if cached.cache.bytes > cached.cache.max {
		t.Fatalf("cache holds %d bytes, bound %d", cached.cache.bytes, cached.cache.max)
	}
}
