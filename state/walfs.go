package state

import (
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Why a slot directory's allocated size was 100x its files' apparent size,
// and what bounds it now (docs/RATIONALE.md, "Bounded disk").
//
// Pebble (v2.1, wal.Options in open.go and DB.walPreallocateSize) gives
// every write-ahead log it creates or recycles an fallocate(KEEP_SIZE) of
// 110% of MemTableSize, 35 MiB per WAL at DefaultMemTableSize: the blocks
// are allocated (du, df, Stat_t.Blocks) while ls shows a file of a few KiB.
// It also keeps up to MemTableStopWritesThreshold+1 obsolete WALs (3 by
// default) to reuse them, and a reused file keeps every block it ever had.
// So a slot held 4 WALs x 35 MiB = 141 MiB from its first seconds, with
// next to nothing written (the demo: ~250 MB for 2 slots, 2.5 MB of files).
//
// Preallocation saves a metadata update when an fsync'ed WAL grows. cairn
// commits with NoSync (durability comes from checkpoints, batch.go) and
// each checkpoint flushes the memtable, so it buys nothing here:
// BenchmarkWALDisk measures the same writes/s with and without it.
//
// walFS therefore (1) turns preallocation into a no-op and (2) does not
// reuse an obsolete WAL's file: it deletes it and creates the new WAL
// empty, as vfs.FS.ReuseForWrite's contract allows. A WAL then holds
// exactly the bytes written to it while it was live. The bound, per slot:
//
//	SSTs + OPTIONS/MANIFEST (the state itself, a few MiB of metadata)
//	+ live and recyclable WALs: at most MemTableStopWritesThreshold+2 files
//	  (4 at Pebble's default), each at most about one memtable of batch
//	  bytes (it rotates when its memtable is full, and at every checkpoint,
//	  which flushes), i.e. at most ~4 x 32 MiB under a write burst that
//	  fills memtables between checkpoints, and the bytes written per
//	  checkpoint interval otherwise.
type walFS struct{ vfs.FS }

// Create implements vfs.FS: the file does not preallocate.
func (fs walFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil {
		return nil, err
	}
	return noPreallocFile{f}, nil
}

// ReuseForWrite implements vfs.FS without reusing: it removes oldname and
// creates newname empty, so the new WAL does not inherit the old one's
// blocks. Pebble stats the returned file for the WAL's size and expects
// exactly this behavior to be possible (wal/standalone_manager.go).
func (fs walFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	if err := fs.FS.Remove(oldname); err != nil {
		return nil, err
	}
	return fs.Create(newname, category)
}

// Unwrap implements vfs's wrapping-FS convention.
func (fs walFS) Unwrap() vfs.FS { return fs.FS }

// noPreallocFile is a file whose Preallocate does nothing (the method is
// documented as optional: "Preallocate optionally preallocates storage").
type noPreallocFile struct{ vfs.File }

func (noPreallocFile) Preallocate(offset, length int64) error { return nil }
