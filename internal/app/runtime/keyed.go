package runtime

import (
	"cairn/engine"
	"cairn/state"
)

// KeyedValues calls fn with every value of the keyed stage in r: its user
// key, sub-key and value (the TTL header taken off).
func KeyedValues(db *state.DB, r state.KeyGroupRange, fn func(key, sub, value []byte) error) error {
	return db.ScanRaw(r, func(k, v []byte) error {
		key, err := state.DecodeKey(k)
		if err != nil || key.Kind != state.KindValue || key.Stage != engine.KeyedStageID {
			return err
		}
		val, _, _, err := state.DecodeValue(v)
		if err != nil {
			return err
		}
		return fn(key.UserKey, key.Sub, val)
	})
}
