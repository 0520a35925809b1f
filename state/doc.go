// Package state is the only importer of Pebble: it keeps one slot's keyed
// state — operator values (with TTL), timers and the engine's counters — in
// a Pebble database whose keys all start with their key group, so a
// key-group range is one contiguous span (keys.go has the layout); and it
// takes the slot's local snapshots (Pebble checkpoints) and rebuilds
// databases from sorted key-value streams for restores.
package state
