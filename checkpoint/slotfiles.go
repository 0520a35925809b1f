package checkpoint

// The files of one slot's checkpoint: the native files of its local
// snapshot (incremental: SSTs to shared/ by content hash, the rest private)
// or the canonical format written from it (full), and their upload.
import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"cairn/internal/base/procs"
	"cairn/internal/base/sysfile"
	"cairn/state"
)

// newManifest checks the slots' snapshots against the writer's slots and
// starts the manifest of a checkpoint or savepoint (what names it in
// errors): job, id, source, modules, slots and their sync figures. It
// returns the snapshots in slot order.
func (w *Writer) newManifest(what string, id uint64, meta Meta, slots []state.SlotSnapshot, start time.Time) (*Manifest, []state.SlotSnapshot, error) {
	if len(slots) != w.cfg.Slots {
		return nil, nil, fmt.Errorf("checkpoint: %s: %d slot snapshots for %d slots", what, len(slots), w.cfg.Slots)
	}
	slots = append([]state.SlotSnapshot(nil), slots...)
	sort.Slice(slots, func(i, j int) bool { return slots[i].Slot < slots[j].Slot })
	m := &Manifest{
		FormatVersion: FormatVersion, Job: w.cfg.Job, ID: id, Time: start,
		KeyGroups: w.cfg.KeyGroups, SourceStream: meta.SourceStream, SourceSeq: meta.SourceSeq,
		Modules: meta.Modules, ABIVersion: meta.ABIVersion, ChainLength: 1,
		StateVersions: meta.StateVersions,
	}
	for i, s := range slots {
		want := state.SlotRange(i, w.cfg.Slots, w.cfg.KeyGroups)
		if s.Slot != i || s.Range != want {
			return nil, nil, fmt.Errorf("checkpoint: %s: snapshot of slot %d range %v, want slot %d range %v", what, s.Slot, s.Range, i, want)
		}
		m.Slots = append(m.Slots, SlotInfo{Slot: i, Range: s.Range})
		m.Figures.SyncPerSlot = append(m.Figures.SyncPerSlot, s.SyncDuration)
		m.Figures.SyncMax = max(m.Figures.SyncMax, s.SyncDuration)
	}
	return m, slots, nil
}

// fullSlots writes every slot's canonical (full) files under dir(slot):
// the key groups of all slots are encoded on every core
// (writeCanonicalSlots; the format is CPU-bound: scan, zstd, SHA-256). A
// store that takes a stream (the file store) receives the data objects as
// they are encoded, in one pass, each committed as soon as its slot is
// written: those uploads come back stored. Otherwise they go to local
// temporary files (added to cleanup) for putAll.
func (w *Writer) fullSlots(ctx context.Context, m *Manifest, slots []state.SlotSnapshot, dir func(slot int) string, cleanup *[]string) ([][]upload, error) {
	ss, stream := asStreamStore(w.store)
	cs := make([]*canonicalSlot, len(slots))
	objs := make([]objectWriter, len(slots))
	files := make([]*os.File, len(slots))
	tmps := make([]string, len(slots))
	defer func() {
		for i := range slots {
			if objs[i] != nil {
				objs[i].Abort()
			}
			if files[i] != nil {
				files[i].Close()
			}
		}
	}()
	for i, s := range slots {
		db, err := state.Open(s.Dir, state.Options{KeyGroups: m.KeyGroups, Range: s.Range, ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("slot %d: %w", s.Slot, err)
		}
		defer db.Close()
		// Once the slot's data is written (the other slots' may still be
		// encoding): close its DB, commit (fsync) or close its output.
		cs[i] = &canonicalSlot{db: db, r: s.Range, done: func() error {
			db.Close()
			if o := objs[i]; o != nil {
				objs[i] = nil
				return o.Commit()
			}
			f := files[i]
			files[i] = nil
			return f.Close()
		}}
		if stream {
			if objs[i], err = ss.create(ctx, dir(s.Slot)+"/"+dataFile); err != nil {
				return nil, fmt.Errorf("slot %d: %w", s.Slot, err)
			}
			cs[i].out = objs[i]
			continue
		}
		if files[i], err = os.CreateTemp(filepath.Dir(s.Dir), ".cairn-full-*.zst"); err != nil {
			return nil, fmt.Errorf("slot %d: %w", s.Slot, err)
		}
		*cleanup = append(*cleanup, files[i].Name())
		tmps[i] = files[i].Name()
		cs[i].out = files[i]
	}
	if err := writeCanonicalSlots(ctx, m.KeyGroups, cs, procs.CPUs()); err != nil {
		return nil, err
	}
	perSlot := make([][]upload, len(slots))
	for i, s := range slots {
		idx, err := json.Marshal(cs[i].index)
		if err != nil {
			return nil, err
		}
		isum := sha256.Sum256(idx)
		d := dir(s.Slot)
		perSlot[i] = []upload{
			{obj: Object{Path: d + "/" + dataFile, File: dataFile, Size: cs[i].size, SHA256: cs[i].sum, Kind: KindFullData, Slot: s.Slot}, local: tmps[i], stored: stream},
			{obj: Object{Path: d + "/" + indexFile, File: indexFile, Size: int64(len(idx)), SHA256: hex.EncodeToString(isum[:]), Kind: KindIndex, Slot: s.Slot}, data: idx},
		}
	}
	return perSlot, nil
}

// isSST reports whether a Pebble file is an SST (shared, content-addressed).
func isSST(name string) bool { return strings.HasSuffix(name, ".sst") }

// incrementalSlot lists the native files of one slot's checkpoint directory.
// SSTs go to shared/ by content hash; every other regular file (MANIFEST-*,
// OPTIONS-*, marker files, WAL *.log) goes to the slot's private folder. An
// empty WAL is uploaded too (it costs nothing and Pebble may expect it).
func (w *Writer) incrementalSlot(m *Manifest, s state.SlotSnapshot) ([]upload, error) {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, err
	}
	var ups []upload
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		local := filepath.Join(s.Dir, e.Name())
		info, err := e.Info()
		if err != nil {
			return nil, err
		}
		sum, err := w.hashFile(s.Slot, local, info)
		if err != nil {
			return nil, err
		}
		o := Object{File: e.Name(), Size: info.Size(), SHA256: sum, Slot: s.Slot}
		if isSST(e.Name()) {
			o.Kind, o.Path = KindSST, SharedPath(m.Job, sum)
		} else {
			o.Kind, o.Path = KindMeta, SlotDir(m.Job, m.ID, s.Slot)+"/"+e.Name()
		}
		ups = append(ups, upload{obj: o, local: local})
	}
	return ups, nil
}

func (w *Writer) hashFile(slot int, p string, info os.FileInfo) (string, error) {
	// An online restore's SST knows its checksum from the manifest, and
	// its content may not all be local yet (state/remote.go).
	if sum, ok := state.RemoteSum(info); ok {
		return sum, nil
	}
	var key sstKey
	cache := false
	if _, ino, ok := sysfile.ID(info); ok && isSST(info.Name()) {
		key = sstKey{slot: slot, name: info.Name(), size: info.Size(), inode: ino}
		if sum, ok := w.mu.hashes[key]; ok {
			return sum, nil
		}
		cache = true
	}
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", err
	}
	if n != info.Size() {
		return "", fmt.Errorf("%s changed size while hashing (%d, was %d)", p, n, info.Size())
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if cache {
		if len(w.mu.hashes) > 1<<20 {
			clear(w.mu.hashes)
		}
		w.mu.hashes[key] = sum
	}
	return sum, nil
}
