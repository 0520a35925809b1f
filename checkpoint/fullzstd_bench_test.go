package checkpoint

// BenchmarkFullVsZstd measures a full checkpoint against the physical limit of writing its format on this machine: the same
// uncompressed record stream (what the full writer feeds its zstd encoders)
// written once to a file, then compressed by `zstd -1 -T0` on the same
// cores into a file on the same disk. Each round times, in turn, a full
// checkpoint (Writer.Commit, mode full, file store), the same bytes through
// `zstd -1 -T0`, and the full pipeline as it was before key groups were
// encoded on every core and streamed into the store (the legacy* functions below: slots in parallel, each encoded into a local
// temp file with one encoder goroutine, then copied into the store). It
// reports the medians of -fullzstd.runs rounds, in MiB/s of uncompressed
// canonical bytes, and their ratios.
//
//	go test ./checkpoint -run '^$' -bench FullVsZstd -benchtime 1x -timeout 0 \
//	    -fullzstd.size 256MiB -fullzstd.runs 5 -fullzstd.dir /work/bench-tmp
//
// When the zstd binary is missing, the baseline is klauspost/compress at
// SpeedFastest with GOMAXPROCS encoder goroutines, and the report says so.

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"hash"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"cairn/internal/app/job"
	"cairn/internal/base/par"
	"cairn/internal/testutil/benchstate"
	"cairn/state"
)

var (
	fzSize   = flag.String("fullzstd.size", "8MiB", "BenchmarkFullVsZstd: state size (key+value bytes)")
	fzRuns   = flag.Int("fullzstd.runs", 3, "BenchmarkFullVsZstd: rounds (each: full checkpoint, zstd -1 -T0, legacy full)")
	fzDir    = flag.String("fullzstd.dir", "", "BenchmarkFullVsZstd: work directory (default: the benchmark's temp dir)")
	fzLegacy = flag.Bool("fullzstd.legacy", true, "BenchmarkFullVsZstd: also time the pre-issue-15 full pipeline in each round")
	fzZstd   = flag.String("fullzstd.zstd", "zstd", "BenchmarkFullVsZstd: the zstd binary (missing: klauspost/compress fallback)")
	fzSlots  = flag.Int("fullzstd.slots", 2, "BenchmarkFullVsZstd: slots")
)

func BenchmarkFullVsZstd(b *testing.B) {
	ctx := context.Background()
	size, err := job.ParseBytes(*fzSize)
	if err != nil {
		b.Fatal(err)
	}
	root := benchstate.WorkDir(b, *fzDir, "fullzstd-"+*fzSize)
	slots := *fzSlots
	s, build := newBenchState(b, filepath.Join(root, "db"), size, slots, 42)
	defer s.Close()
	snaps, _ := s.snapshot(b, filepath.Join(root, "local", "chk"))
	native := dirSize(b, filepath.Join(root, "local", "chk"))

	// The same bytes: every slot's record stream, as the full writer
	// encodes it, in one file.
	rawPath := filepath.Join(root, "raw")
	rawBytes := dumpRaw(b, snaps, rawPath)

	store, err := NewFileStore(filepath.Join(root, "store"), true)
	if err != nil {
		b.Fatal(err)
	}
	// Retain 1: each full checkpoint replaces the previous one (its
	// retention runs inside Commit, timed), as each zstd run replaces its
	// output and each legacy run's objects are deleted after it: the
	// store does not grow round after round.
	w, err := NewWriter(ctx, store, WriterConfig{Job: "full", KeyGroups: benchstate.KeyGroups, Slots: slots, Mode: ModeFull,
		Retain: 1, Logger: quietLogger(), Scrub: ScrubConfig{Disabled: true}})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close(ctx)

	zstdBin, lookErr := exec.LookPath(*fzZstd)
	baseline := "`zstd -1 -T0`"
	if lookErr != nil {
		baseline = fmt.Sprintf("klauspost/compress zstd SpeedFastest, concurrency %d (no zstd binary: %v)", runtime.GOMAXPROCS(0), lookErr)
	} else if out, err := exec.Command(zstdBin, "--version").CombinedOutput(); err == nil {
		baseline += " (" + strings.TrimSpace(string(out)) + ")"
	}
	zOut := filepath.Join(root, "raw.zst")
	runZstd := func() (time.Duration, int64) {
		os.Remove(zOut)
		exec.Command("sync", "-f", root).Run()
		in, err := os.Open(rawPath)
		if err != nil {
			b.Fatal(err)
		}
		defer in.Close()
		out, err := os.Create(zOut)
		if err != nil {
			b.Fatal(err)
		}
		defer out.Close()
		t := time.Now()
		if lookErr == nil {
			cmd := exec.Command(zstdBin, "-1", "-T0", "-q", "-c")
			var stderr strings.Builder
			cmd.Stdin, cmd.Stdout, cmd.Stderr = in, out, &stderr
			if err := cmd.Run(); err != nil {
				b.Fatalf("zstd: %v: %s", err, stderr.String())
			}
		} else {
			enc, err := zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(enc, in); err != nil {
				b.Fatal(err)
			}
			if err := enc.Close(); err != nil {
				b.Fatal(err)
			}
		}
		d := time.Since(t)
		st, err := out.Stat()
		if err != nil {
			b.Fatal(err)
		}
		return d, st.Size()
	}

	var fulls, zs, legacies []time.Duration
	var fullSize, zSize, legacySize int64
	id := uint64(1)
	for range *fzRuns {
		exec.Command("sync", "-f", root).Run()
		t := time.Now()
		m, err := w.Commit(ctx, id, Meta{SourceSeq: id, Mode: ModeFull}, snaps)
		if err != nil {
			b.Fatal(err)
		}
		fulls = append(fulls, time.Since(t))
		id++
		fullSize = 0
		for _, o := range m.Objects {
			if o.Kind == KindFullData {
				fullSize += o.Size
			}
		}
		d, n := runZstd()
		zs, zSize = append(zs, d), n
		if *fzLegacy {
			exec.Command("sync", "-f", root).Run()
			t := time.Now()
			legacySize = legacyFull(b, store, fmt.Sprintf("legacy/%d", id), snaps)
			legacies = append(legacies, time.Since(t))
			objs, err := listAll(ctx, store, "legacy/")
			if err != nil {
				b.Fatal(err)
			}
			for _, o := range objs {
				store.Delete(ctx, o.Name)
			}
		}
	}

	med := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	list := func(ds []time.Duration) string {
		var p []string
		for _, d := range ds {
			p = append(p, fmt.Sprintf("%.0f", mbps(rawBytes, d)))
		}
		return strings.Join(p, ", ")
	}
	fullMed, zMed := med(fulls), med(zs)
	// Each round's ratio, full against the zstd run right after it (the
	// same conditions on a shared machine).
	var ratios []string
	var rs []time.Duration
	for i := range fulls {
		r := zs[i].Seconds() / fulls[i].Seconds()
		ratios = append(ratios, fmt.Sprintf("%.2f", r))
		rs = append(rs, time.Duration(r*1e6))
	}
	fmt.Printf("\n### Full checkpoint vs %s, %s of keyed state (%d slots, GOMAXPROCS %d)\n\n", baseline, *fzSize, slots, runtime.GOMAXPROCS(0))
	fmt.Printf("%d keys, build %s; snapshot (native) %s MiB; uncompressed canonical records %s MiB; compressed: full %s MiB, zstd -1 %s MiB.\n\n",
		s.Keys, secs(build), mib(native), mib(rawBytes), mib(fullSize), mib(zSize))
	fmt.Printf("| pipeline | median | MiB/s (uncompressed) at median | each round, MiB/s | ÷ zstd |\n|---|---:|---:|---|---:|\n")
	fmt.Printf("| full checkpoint (Writer.Commit) | %s | %.0f | %s | %.2f× |\n", secs(fullMed), mbps(rawBytes, fullMed), list(fulls), zMed.Seconds()/fullMed.Seconds())
	fmt.Printf("| baseline: same bytes through zstd | %s | %.0f | %s | 1.00× |\n", secs(zMed), mbps(rawBytes, zMed), list(zs))
	if *fzLegacy {
		lMed := med(legacies)
		fmt.Printf("| legacy pipeline (%s MiB) | %s | %.0f | %s | %.2f× |\n", mib(legacySize), secs(lMed), mbps(rawBytes, lMed), list(legacies), zMed.Seconds()/lMed.Seconds())
		b.ReportMetric(mbps(rawBytes, lMed), "legacy-MiB/s")
	}
	fmt.Printf("\nPer round, full ÷ zstd: %s (median %.2f).\n", strings.Join(ratios, ", "), float64(med(rs))/1e6)
	fmt.Printf("\nSUMMARY fullzstd size=%s full_mibps=%.0f zstd_mibps=%.0f ratio=%.2f round_ratio_median=%.2f\n", *fzSize, mbps(rawBytes, fullMed), mbps(rawBytes, zMed), zMed.Seconds()/fullMed.Seconds(), float64(med(rs))/1e6)
	b.ReportMetric(mbps(rawBytes, fullMed), "full-MiB/s")
	b.ReportMetric(mbps(rawBytes, zMed), "zstd-MiB/s")
	b.ReportMetric(zMed.Seconds()/fullMed.Seconds(), "full/zstd")
}

// dumpRaw writes the slots' uncompressed canonical record streams, slot
// after slot, to path and returns their size.
func dumpRaw(tb testing.TB, snaps []state.SlotSnapshot, path string) int64 {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	var n int64
	var rec []byte
	for _, sn := range snaps {
		db, err := state.Open(sn.Dir, state.Options{KeyGroups: benchstate.KeyGroups, Range: sn.Range, ReadOnly: true})
		if err != nil {
			tb.Fatal(err)
		}
		for kg := sn.Range.First; kg <= sn.Range.Last; kg++ {
			err := db.ScanRaw(state.KeyGroupRange{First: kg, Last: kg}, func(k, v []byte) error {
				rec = binary.AppendUvarint(rec[:0], uint64(len(k)))
				rec = append(rec, k...)
				rec = binary.AppendUvarint(rec, uint64(len(v)))
				rec = append(rec, v...)
				n += int64(len(rec))
				_, err := bw.Write(rec)
				return err
			})
			if err != nil {
				tb.Fatal(err)
			}
		}
		db.Close()
	}
	if err := bw.Flush(); err != nil {
		tb.Fatal(err)
	}
	return n
}

// legacyFull is the full checkpoint's data path before the parallel,
// streamed writer (the
// writer's fullSlots, fullSlot and putAll of that time, minus the
// manifest): one slot per core, each slot's canonical file written with a
// single-goroutine encoder into a local temp file, then copied into the
// store (temp file, fsync, rename). It returns the data bytes written.
func legacyFull(tb testing.TB, store Store, prefix string, snaps []state.SlotSnapshot) int64 {
	ctx := context.Background()
	type res struct {
		tmp  string
		size int64
		idx  []byte
	}
	out := make([]res, len(snaps))
	var mu sync.Mutex
	err := par.Do(ctx, len(snaps), runtime.GOMAXPROCS(0), func(ctx context.Context, i int) error {
		sn := snaps[i]
		db, err := state.Open(sn.Dir, state.Options{KeyGroups: benchstate.KeyGroups, Range: sn.Range, ReadOnly: true})
		if err != nil {
			return err
		}
		defer db.Close()
		f, err := os.CreateTemp(filepath.Dir(sn.Dir), ".legacy-full-*.zst")
		if err != nil {
			return err
		}
		x, size, _, err := legacyWriteCanonical(ctx, db, benchstate.KeyGroups, sn.Range, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		idx, err := json.Marshal(x)
		if err != nil {
			return err
		}
		mu.Lock()
		out[i] = res{tmp: f.Name(), size: size, idx: idx}
		mu.Unlock()
		return nil
	})
	defer func() {
		for _, r := range out {
			if r.tmp != "" {
				os.Remove(r.tmp)
			}
		}
	}()
	if err != nil {
		tb.Fatal(err)
	}
	var ups []upload
	var total int64
	for i, r := range out {
		ups = append(ups, upload{obj: Object{Path: fmt.Sprintf("%s/slot-%d/%s", prefix, i, dataFile)}, local: r.tmp},
			upload{obj: Object{Path: fmt.Sprintf("%s/slot-%d/%s", prefix, i, indexFile)}, data: r.idx})
		total += r.size
	}
	if err := par.Do(ctx, len(ups), 4, func(ctx context.Context, i int) error { return putUpload(ctx, store, ups[i]) }); err != nil {
		tb.Fatal(err)
	}
	return total
}

// legacyWriteCanonical is writeCanonical as it was before the parallel
// writer, verbatim: the baseline of this benchmark and of
// TestCanonicalSameBytesAsBefore.
func legacyWriteCanonical(ctx context.Context, db slotScanner, keyGroups int, r state.KeyGroupRange, f *os.File) (*SegmentIndex, int64, string, error) {
	cw := &countingWriter{w: f, h: sha256.New()}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithEncoderCRC(true))
	if err != nil {
		return nil, 0, "", err
	}
	defer enc.Close()
	x := &SegmentIndex{FormatVersion: FormatVersion, KeyGroups: keyGroups, Range: r}
	var rec []byte
	for kg := r.First; kg <= r.Last; kg++ {
		if err := ctx.Err(); err != nil {
			return nil, 0, "", err
		}
		seg := Segment{KeyGroup: kg, Offset: cw.n}
		started := false
		err := db.ScanRaw(state.KeyGroupRange{First: kg, Last: kg}, func(k, v []byte) error {
			if !started {
				enc.Reset(cw)
				started = true
			}
			rec = binary.AppendUvarint(rec[:0], uint64(len(k)))
			rec = append(rec, k...)
			rec = binary.AppendUvarint(rec, uint64(len(v)))
			rec = append(rec, v...)
			seg.Count++
			seg.RawBytes += int64(len(rec))
			_, err := enc.Write(rec)
			return err
		})
		if err != nil {
			return nil, 0, "", fmt.Errorf("key group %d: %w", kg, err)
		}
		if started {
			if err := enc.Close(); err != nil {
				return nil, 0, "", fmt.Errorf("key group %d: %w", kg, err)
			}
			seg.Length = cw.n - seg.Offset
		} else {
			seg.Offset = 0
		}
		x.Segments = append(x.Segments, seg)
	}
	return x, cw.n, hex.EncodeToString(cw.h.Sum(nil)), nil
}

// countingWriter hashes and counts what passes to w (legacyWriteCanonical).
type countingWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}
