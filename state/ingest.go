package state

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// ingestFileSize is the target size of each SST IngestSorted writes (a
// variable so tests can lower it).
var ingestFileSize uint64 = 64 << 20

// ingestStaging is the folder inside the new DB's directory where IngestSorted
// stages its SSTs; it is removed before IngestSorted returns.
const ingestStaging = "ingest.tmp"

// IngestSorted builds a fresh DB in dir from raw keys and values in strictly
// increasing key order (as ScanRaw produces them), and returns it open. It
// writes SST files of about 64 MiB with Pebble's table writer and ingests them,
// so the entries land in the bottom level without passing through the
// memtable; this is how a full (canonical) checkpoint is restored.
//
// kvs calls yield for each pair; key and value may be reused by kvs after yield
// returns. Every key must decode, lie in o.Range (ErrOutOfRange otherwise: a
// rescaled restore feeds only the key groups it needs), and follow its
// predecessor (ErrUnsorted). dir must not exist or be empty (ErrNotEmpty). On
// failure the DB is closed and dir removed.
func IngestSorted(dir string, o Options, kvs func(yield func(key, value []byte) error) error) (_ *DB, err error) {
	if o.ReadOnly {
		return nil, fmt.Errorf("state: ingest %s: read-only options", dir)
	}
	if ents, rerr := os.ReadDir(dir); rerr == nil && len(ents) > 0 {
		return nil, fmt.Errorf("state: ingest %s: %w", dir, ErrNotEmpty)
	} else if rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		return nil, fmt.Errorf("state: ingest %s: %w", dir, rerr)
	}
	d, err := Open(dir, o)
	if err != nil {
		return nil, err
	}
	if err := d.IngestSorted(kvs); err != nil {
		_ = d.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return d, nil
}

// IngestSorted adds raw keys and values in strictly increasing key order to
// the DB, as SST files written with Pebble's table writer and ingested (see
// the function IngestSorted for kvs and the checks on every key). Ingestion
// is atomic: on failure the DB is as it was. Keys the DB already holds are
// replaced; a rescaled restore ingests key groups the DB does not hold, so
// the files land in the bottom level.
func (d *DB) IngestSorted(kvs func(yield func(key, value []byte) error) error) (err error) {
	if d.opts.ReadOnly {
		return fmt.Errorf("state: ingest %s: read-only", d.dir)
	}
	if err := d.release(true); err != nil {
		return err
	}
	d.clearCache()
	d.timers.reset()
	dir, o := d.dir, d.opts
	staging := filepath.Join(dir, ingestStaging)
	defer func() {
		if rerr := os.RemoveAll(staging); rerr != nil && err == nil {
			err = fmt.Errorf("state: ingest %s: remove staging: %w", dir, rerr)
		}
	}()
	if err := os.Mkdir(staging, 0o755); err != nil {
		return fmt.Errorf("state: ingest %s: %w", dir, err)
	}

	// The files land in the bottom level: its options, so no bloom filter
	// (pebbleOptions).
	wo := d.po.MakeWriterOptions(len(d.po.Levels)-1, d.db.TableFormat())
	var (
		w     *sstable.Writer
		paths []string
		prev  []byte
		n     int
	)
	finish := func() error {
		if w == nil {
			return nil
		}
		cerr := w.Close()
		w = nil
		if cerr != nil {
			return fmt.Errorf("state: ingest %s: write %s: %w", dir, paths[len(paths)-1], cerr)
		}
		return nil
	}
	yield := func(key, value []byte) error {
		if err := checkRaw(key, value); err != nil {
			return fmt.Errorf("state: ingest %s: %w", dir, err)
		}
		if kg := int(binary.BigEndian.Uint16(key)); !o.Range.Contains(kg) {
			return fmt.Errorf("state: ingest %s: key %x of key group %d not in %v: %w", dir, key, kg, o.Range, ErrOutOfRange)
		}
		if n > 0 && bytes.Compare(prev, key) >= 0 {
			return fmt.Errorf("state: ingest %s: key %x after %x: %w", dir, key, prev, ErrUnsorted)
		}
		prev = append(prev[:0], key...)
		n++
		if w == nil {
			path := filepath.Join(staging, fmt.Sprintf("%06d.sst", len(paths)))
			f, err := vfs.Default.Create(path, vfs.WriteCategoryUnspecified)
			if err != nil {
				return fmt.Errorf("state: ingest %s: %w", dir, err)
			}
			paths = append(paths, path)
			w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), wo)
		}
		if err := w.Set(key, value); err != nil {
			return fmt.Errorf("state: ingest %s: write %s: %w", dir, paths[len(paths)-1], err)
		}
		if w.Raw().EstimatedSize() >= ingestFileSize {
			return finish()
		}
		return nil
	}
	if err := kvs(yield); err != nil {
		if w != nil {
			_ = w.Close()
		}
		return err
	}
	if err := finish(); err != nil {
		return err
	}
	if len(paths) > 0 {
		if err := d.db.Ingest(context.Background(), paths); err != nil {
			return fmt.Errorf("state: ingest %s: %d files: %w", dir, len(paths), err)
		}
	}
	return nil
}
