// Package checkpoint stores a job's checkpoints in an object store (file://
// or s3://): the store abstraction, manifests, the incremental and full
// (canonical) writers, retention, GC and the orphan sweep.
//
// Names: "incremental" and "full" are the two modes a user chooses;
// "native" is how an incremental checkpoint stores a slot (Pebble's own
// files), "canonical" how a full one does (one zstd frame, a "segment",
// per key group, and an index of them). The sync part of a checkpoint is a
// slot's pause (state.SlotSnapshot.SyncDuration); a checkpoint's SyncMax is
// the slowest slot's.
//
// # Stores
//
// Store is a small interface (put, create-if-absent, get, ranged get, list,
// delete, stat), like pebble's remote.Storage. OpenStore wraps every store in
// a RetryStore (exponential backoff with full jitter on 5xx/429, timeouts
// and connection resets; never on 4xx, precondition failures, ErrNotFound,
// ErrExists, corruption or fsync errors).
//
// file:// is a store of our own on package os, not gocloud.dev's fileblob:
// fileblob writes through a temp file and rename but never fsyncs the file or
// the directory, and has no atomic create-if-absent. Ours writes a temp file,
// fsyncs it, renames it into place and fsyncs the directory (and the parent of
// every directory it creates); Create (the manifest commit) links the fsynced
// temp file to the final name with link(2), which fails with EEXIST instead
// of replacing, so a manifest is never overwritten. Temp files
// (".tmp-<name>-<random>") are listed like objects, so the orphan sweep
// removes those a crash leaves. An fsync failure is a *SyncError and never
// retried.
//
// s3:// uses the AWS SDK's own S3 client (service/s3, with config's
// standard credential chain); the URL path is a key prefix, and the query
// takes the parameters gocloud.dev's s3blob took before (s3Params). Objects
// up to 8 MiB go in one PUT, larger ones as multipart uploads (a file is sent
// in place, part by part; a stream through part buffers). Create sends
// If-None-Match: * (AWS S3, versitygw and gofakes3 answer 412 for an existing
// key; tested), preceded by a HEAD: on a server that ignores the condition the
// HEAD still refuses an existing manifest, which is safe with a single writer
// per job.
//
// # Layout and commit
//
//	<job>/shared/<sha256[0:2]>/<sha256>.sst   incremental SSTs, by content
//	<job>/chk-<20-digit id>/slot-<i>/...        private files of a checkpoint
//	<job>/chk-<20-digit id>/MANIFEST.json       the commit point, written last
//	<job>/savepoints/<name>/...                 never touched by GC
//
// A checkpoint exists only when its manifest does. The set of manifests (and
// savepoint manifests) is the only reference registry: retention deletes a
// manifest first, then its private files, then the shared objects no
// remaining manifest references; the orphan sweep deletes any other object
// that no manifest references once it is older than the grace period. A
// crash at any step leaves only unreferenced objects, which the sweep
// removes later. Checkpoint ids only grow and a writer never reuses the id of
// an uncommitted attempt whose objects are still in the store.
//
// # Incremental checkpoints
//
// Every *.sst of a slot's local Pebble checkpoint is named by its SHA-256 and
// uploaded to shared/ unless a committed manifest already references it
// (hashes are cached per (slot, name, size, inode): SSTs are immutable).
// Every other file — MANIFEST-*, OPTIONS-*, markers and the WAL — goes to the
// slot's private folder. state.DB.Checkpoint flushes the memtable and uses
// Pebble's WithFlushedWAL, so the WAL holds no state (tens of bytes); it is
// uploaded anyway so the folder is exactly what Pebble wrote and opens
// without special cases.
//
// # Integrity of reused objects
//
// See integrity.go: a writer reuses a shared object only while it knows it
// intact in the store (uploaded by this process, or read back with the
// manifest's size and SHA-256); it checks sizes at start, reads an object
// back before its first reuse, and re-reads reusable objects in a
// background scrub at a bounded rate. A damaged object is re-uploaded from
// a local copy or by the next checkpoint that holds it, never referenced
// again as it is. `cairn checkpoints gc` refuses a grace period under
// MinGCGrace: a running job's uploads precede the manifest that references
// them.
//
// # Full checkpoints
//
// See canonical.go: one zstd frame per key group, an index of offsets, read
// back per key group with ranged reads (ReadKeyGroup).
package checkpoint
