package engine

import "cairn/state"

// slotCaches sizes a slot DB's block cache and its value cache
// (state/cache.go). Under a memory budget (SlotCacheBytes set) the value
// cache is carved out of the block cache's share — an eighth, at most
// state.DefaultValueCacheBytes — so the budget's total holds; without one
// both take their defaults.
func (c *Config) slotCaches() (block int64, value int) {
	if c.SlotCacheBytes <= 0 {
		return 0, 0
	}
	v := min(int64(state.DefaultValueCacheBytes), c.SlotCacheBytes/8)
	return c.SlotCacheBytes - v, int(v)
}
