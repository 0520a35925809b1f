// Package recovery restores a job's slot state from a committed checkpoint
// or savepoint (docs/DESIGN.md, "Restore"): from the store, from the node's own
// last local checkpoint (local recovery), from a standby's cache, onto the
// same or a different slot count (rescaled restore).
//
// # Atomicity
//
// Restore builds everything under <data_dir>/restore.tmp-<id>-<random>: every
// object is linked or downloaded there and checked against the manifest's
// size and SHA-256, each target slot's DB is built there and opened once to
// validate it. Only then does <data_dir>/state change: the old directory is
// renamed away, the new one renamed in, the data directory fsynced, the old
// one removed. A refusal or failure at any earlier point leaves
// <data_dir>/state exactly as it was.
//
// # Paths
//
//   - incremental, same slot count: the slot's native Pebble files are placed
//     into the slot directory as they are (no rewriting);
//   - full, any slot count: each target slot is rebuilt with
//     state.IngestSorted from the canonical segments of the key groups it
//     owns, read by ranged reads (checkpoint.ReadSegment);
//   - incremental, rescaled: each needed old slot's native files are
//     materialised (hard links). Each new slot starts as a copy of the old
//     slot it overlaps most (SSTs linked, metadata copied) with the keys
//     outside its range excised (state.DB.DeleteOutsideRange: no key is
//     rewritten); when its range spans old slots, the other key groups are
//     copied out of those, opened read-only, with ScanRaw into
//     state.DB.IngestSorted. A new slot never holds keys outside its range.
//
// # Trusting local files
//
// Hashing 4 GiB of local files takes seconds, which would defeat local
// recovery. A trust index (checkpoint.TrustIndex: the checkpoint writer keeps one for the local
// checkpoint copy, the standby one for its cache) records, for each file
// whose SHA-256 was known to match the manifest, its size, inode and
// modification time. A file whose (size, inode, mtime) still match is used
// without hashing; any other candidate is hashed, and downloaded when it
// does not match. Writing a file changes its mtime, so an edited file is
// never trusted by the index.
package recovery
