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
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"cairn/internal/par"
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

// fullSlots writes every slot's canonical (full) files, one slot per core:
// the format is CPU-bound (scan, zstd, sha256). Temporary files go to
// cleanup.
func (w *Writer) fullSlots(ctx context.Context, m *Manifest, slots []state.SlotSnapshot, cleanup *[]string) ([][]upload, error) {
	perSlot := make([][]upload, len(slots))
	var cmu sync.Mutex
	err := par.Do(ctx, len(slots), runtime.GOMAXPROCS(0), func(ctx context.Context, i int) error {
		var mine []string
		ups, err := w.fullSlot(ctx, m, slots[i], &mine)
		cmu.Lock()
		*cleanup = append(*cleanup, mine...)
		cmu.Unlock()
		if err != nil {
			return fmt.Errorf("slot %d: %w", slots[i].Slot, err)
		}
		perSlot[i] = ups
		return nil
	})
	return perSlot, err
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
	if st, ok := info.Sys().(*syscall.Stat_t); ok && isSST(info.Name()) {
		key = sstKey{slot: slot, name: info.Name(), size: info.Size(), inode: st.Ino}
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

// fullSlot writes the canonical format of one slot into temp files next to
// its checkpoint directory.
func (w *Writer) fullSlot(ctx context.Context, m *Manifest, s state.SlotSnapshot, cleanup *[]string) ([]upload, error) {
	db, err := state.Open(s.Dir, state.Options{KeyGroups: m.KeyGroups, Range: s.Range, ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	f, err := os.CreateTemp(filepath.Dir(s.Dir), ".cairn-full-*.zst")
	if err != nil {
		return nil, err
	}
	*cleanup = append(*cleanup, f.Name())
	x, size, sum, err := writeCanonical(ctx, db, m.KeyGroups, s.Range, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	idx, err := json.Marshal(x)
	if err != nil {
		return nil, err
	}
	isum := sha256.Sum256(idx)
	dir := SlotDir(m.Job, m.ID, s.Slot)
	return []upload{
		{obj: Object{Path: dir + "/" + dataFile, File: dataFile, Size: size, SHA256: sum, Kind: KindFullData, Slot: s.Slot}, local: f.Name()},
		{obj: Object{Path: dir + "/" + indexFile, File: indexFile, Size: int64(len(idx)), SHA256: hex.EncodeToString(isum[:]), Kind: KindIndex, Slot: s.Slot}, data: idx},
	}, nil
}
