package state

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// TestPointReadsSeeEveryWrite: Get reads through Pebble's Get or through
// one iterator kept between writes (point.go); a random mix of commits,
// reads, flushes, checkpoints (their hold and release) and EndReads, with
// the value cache off so every read reaches Pebble, reads exactly what a
// map of the writes holds. Reads alternate between stretches of mostly
// absent keys and of present ones, so both ways of reading are used.
func TestPointReadsSeeEveryWrite(t *testing.T) {
	root := t.TempDir()
	o := testOptions()
	o.ValueCacheBytes = -1
	d := openDB(t, filepath.Join(root, "db"), o)
	r := rand.New(rand.NewPCG(1, 2))
	const keys = 300
	model := map[string]string{}
	key := func(i int) []byte { return []byte(fmt.Sprintf("k-%04d", i)) }
	var finish func(string) error
	checkpoints, pointReads, getReads := 0, 0, 0
	for step := range 5_000 {
		switch op := r.IntN(100); {
		case op < 50: // a read
			i := r.IntN(keys)
			if step/500%2 == 1 {
				i += keys // absent: never written
			}
			k := key(i)
			if d.pointOn {
				pointReads++
			} else {
				getReads++
			}
			v, ok, err := d.Get(1, KeyGroup(k, testKGs), k, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want, wok := model[string(k)]; ok != wok || string(v) != want {
				t.Fatalf("step %d: Get(%s) = %q, %v; the writes say %q, %v", step, k, v, ok, want, wok)
			}
		case op < 80: // a commit of a few writes
			b := d.NewBatch()
			for range 1 + r.IntN(5) {
				k := key(r.IntN(keys))
				if r.IntN(4) == 0 {
					b.Delete(1, KeyGroup(k, testKGs), k, nil)
					delete(model, string(k))
				} else {
					v := fmt.Sprintf("v-%d", step)
					b.Put(1, KeyGroup(k, testKGs), k, nil, []byte(v))
					model[string(k)] = v
				}
			}
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			b.Close()
		case op < 88:
			d.EndReads()
		case op < 92: // a flush outside any checkpoint (within one, the
			// checkpoint would be abandoned as raced)
			if finish != nil {
				continue
			}
			if err := d.db.Flush(); err != nil {
				t.Fatal(err)
			}
		case op < 98: // a checkpoint's barrier, or its capture
			if finish == nil {
				f, err := d.CheckpointBegin()
				if err != nil {
					t.Fatal(err)
				}
				finish = f
			} else {
				checkpoints++
				if err := finish(filepath.Join(root, fmt.Sprintf("chk-%d", checkpoints))); err != nil {
					t.Fatal(err)
				}
				finish = nil
			}
		default: // a compaction of everything
			if err := d.db.Compact(t.Context(), []byte{0}, []byte{0xff}, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	if checkpoints == 0 || pointReads < 100 || getReads < 100 {
		t.Fatalf("%d checkpoints captured, %d reads through the iterator, %d through Get: too few", checkpoints, pointReads, getReads)
	}
}
