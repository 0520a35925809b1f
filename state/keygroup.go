package state

import (
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// MaxKeyGroups is the largest key-group count a job may use. Key groups are
// stored as 2 bytes big-endian in every Pebble key, so the bound is part of the
// on-disk format.
const MaxKeyGroups = 32768

// DefaultKeyGroups is the key-group count of a job that does not set one.
const DefaultKeyGroups = 128

// KeyGroupRange is an inclusive range of key groups [First, Last], the unit of
// state a slot owns.
type KeyGroupRange struct {
	First int `json:"first"`
	Last  int `json:"last"`
}

// Contains reports whether kg lies in the range.
func (r KeyGroupRange) Contains(kg int) bool { return kg >= r.First && kg <= r.Last }

// Len is the number of key groups in the range (0 for an empty range).
func (r KeyGroupRange) Len() int {
	if r.Last < r.First {
		return 0
	}
	return r.Last - r.First + 1
}

// Overlaps reports whether two ranges share a key group.
func (r KeyGroupRange) Overlaps(o KeyGroupRange) bool {
	return r.Len() > 0 && o.Len() > 0 && r.First <= o.Last && o.First <= r.Last
}

func (r KeyGroupRange) String() string { return fmt.Sprintf("[%d,%d]", r.First, r.Last) }

// ValidateKeyGroups checks a key-group count.
func ValidateKeyGroups(keyGroups int) error {
	if keyGroups < 1 || keyGroups > MaxKeyGroups {
		return fmt.Errorf("state: key_groups %d out of range [1, %d]", keyGroups, MaxKeyGroups)
	}
	return nil
}

// ValidateSlots checks a slot count against a key-group count: every slot must
// own at least one key group.
func ValidateSlots(slots, keyGroups int) error {
	if slots < 1 || slots > keyGroups {
		return fmt.Errorf("state: slots %d out of range [1, key_groups=%d]", slots, keyGroups)
	}
	return nil
}

// KeyGroup maps a record key to its key group:
// xxhash64(key) % keyGroups.
//
// INVARIANT: this function is part of the on-disk and on-wire format (it
// decides which Pebble keys and which output partition a key lands in); it must
// never change. Test vectors in keygroup_test.go pin it.
func KeyGroup(key []byte, keyGroups int) int {
	return int(xxhash.Sum64(key) % uint64(keyGroups))
}

// SlotRange is the contiguous key-group range slot i of p slots owns:
// [ (i*kg + p - 1) / p , ((i+1)*kg - 1) / p ], Flink's assignment.
func SlotRange(slot, slots, keyGroups int) KeyGroupRange {
	return KeyGroupRange{
		First: (slot*keyGroups + slots - 1) / slots,
		Last:  ((slot+1)*keyGroups - 1) / slots,
	}
}

// SlotOf is the slot of p slots that owns key group kg: kg * p / keyGroups.
func SlotOf(kg, slots, keyGroups int) int {
	return kg * slots / keyGroups
}
