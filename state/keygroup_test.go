package state

import "testing"

// TestKeyGroupVectors pins KeyGroup: it is part of the on-disk format.
// xxhash64("") = 0xef46db3751d8e999, so "" lands in 0x99 % 128 = 25.
func TestKeyGroupVectors(t *testing.T) {
	for _, v := range []struct {
		key  string
		kgs  int
		want int
	}{
		{"", 128, 25},
		{"a", 128, 91},
		{"hello", 128, 35},
		{"word-42", 128, 2},
		{"hello", 32768, 28067},
		{"hello", 7, 1},
	} {
		if got := KeyGroup([]byte(v.key), v.kgs); got != v.want {
			t.Errorf("KeyGroup(%q, %d) = %d, want %d", v.key, v.kgs, got, v.want)
		}
	}
}

func TestSlotRangesPartition(t *testing.T) {
	for _, kgs := range []int{1, 7, 128, 32768} {
		for p := 1; p <= 64; p++ {
			if ValidateSlots(p, kgs) != nil {
				continue
			}
			next := 0
			for i := 0; i < p; i++ {
				r := SlotRange(i, p, kgs)
				if r.First != next {
					t.Fatalf("kgs=%d p=%d slot %d: range %v does not start at %d", kgs, p, i, r, next)
				}
				if r.Len() < 1 {
					t.Fatalf("kgs=%d p=%d slot %d: empty range %v", kgs, p, i, r)
				}
				for kg := r.First; kg <= r.Last; kg++ {
					if s := SlotOf(kg, p, kgs); s != i {
						t.Fatalf("kgs=%d p=%d: SlotOf(%d)=%d, range says %d", kgs, p, kg, s, i)
					}
				}
				next = r.Last + 1
			}
			if next != kgs {
				t.Fatalf("kgs=%d p=%d: ranges cover [0,%d), want [0,%d)", kgs, p, next, kgs)
			}
		}
	}
}
