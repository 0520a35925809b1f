package recovery

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Phase is the step a restore is in.
type Phase string

const (
	// PhaseFetch: linking and downloading files (full mode: reading the
	// indexes).
	PhaseFetch Phase = "fetch"
	// PhaseBuild: building and validating the slots' DBs (full mode and
	// rescaled restores read the data in this phase).
	PhaseBuild Phase = "build"
	// PhaseSwap: moving the new state into place.
	PhaseSwap Phase = "swap"
	// PhaseDone: finished.
	PhaseDone Phase = "done"
	// PhaseFailed: stopped by an error; the old state is unchanged.
	PhaseFailed Phase = "failed"
)

// Progress is a snapshot of a running restore.
type Progress struct {
	Phase Phase
	// BytesDone counts bytes linked, copied or downloaded so far;
	// BytesTotal is what the restore will read (0 until known).
	BytesDone, BytesTotal int64
	FilesDone, FilesTotal int
	// BytesDownloaded is the part of BytesDone that came from the store.
	BytesDownloaded int64
	Elapsed         time.Duration
}

// progressTracker calls the callback periodically until stopped.
type progressTracker struct {
	fn         func(Progress)
	c          *counters
	start      time.Time
	bytesTotal atomic.Int64
	filesTotal atomic.Int64
	ph         atomic.Value // Phase
	done       chan struct{}
	wg         sync.WaitGroup
}

func startProgress(fn func(Progress), every time.Duration, c *counters, start time.Time) *progressTracker {
	t := &progressTracker{fn: fn, c: c, start: start, done: make(chan struct{})}
	t.ph.Store(PhaseFetch)
	if fn == nil {
		return t
	}
	if every <= 0 {
		every = 250 * time.Millisecond
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-t.done:
				return
			case <-tick.C:
				t.fn(t.snapshot())
			}
		}
	}()
	return t
}

func (t *progressTracker) snapshot() Progress {
	return Progress{
		Phase: t.ph.Load().(Phase), BytesDone: t.c.bytesDone.Load(), BytesTotal: t.bytesTotal.Load(),
		FilesDone: int(t.c.filesDone.Load()), FilesTotal: int(t.filesTotal.Load()),
		BytesDownloaded: t.c.bytesDownloaded.Load(), Elapsed: time.Since(t.start),
	}
}

func (t *progressTracker) setTotal(bytes int64, files int) {
	t.bytesTotal.Store(bytes)
	t.filesTotal.Store(int64(files))
}

func (t *progressTracker) phase(p Phase) { t.ph.Store(p) }

// stop ends the periodic calls and reports the final snapshot.
func (t *progressTracker) stop(p Phase) {
	t.ph.Store(p)
	if t.fn == nil {
		return
	}
	close(t.done)
	t.wg.Wait()
	t.fn(t.snapshot())
}

// ProgressPrinter returns a Progress callback that writes to w: on a
// terminal (tty), one bar redrawn in place (bytes, files, throughput, ETA);
// otherwise a plain line at most every 5 seconds, plus the final one.
func ProgressPrinter(w io.Writer, tty bool) func(Progress) {
	var mu sync.Mutex
	lastAt := time.Duration(-1)
	return func(p Progress) {
		mu.Lock()
		defer mu.Unlock()
		final := p.Phase == PhaseDone || p.Phase == PhaseFailed
		if tty {
			fmt.Fprintf(w, "\r\033[K%s", FormatProgress(p, true))
			if final {
				fmt.Fprintln(w)
			}
			return
		}
		if !final && lastAt >= 0 && p.Elapsed-lastAt < 5*time.Second {
			return
		}
		lastAt = p.Elapsed
		fmt.Fprintln(w, FormatProgress(p, false))
	}
}

// FormatProgress renders p as one line, with a bar when bar is true.
func FormatProgress(p Progress, bar bool) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "restore %-5s ", p.Phase)
	frac := 0.0
	if p.BytesTotal > 0 {
		frac = min(1, float64(p.BytesDone)/float64(p.BytesTotal))
	}
	if bar {
		const width = 30
		n := int(frac * width)
		sb.WriteString("[" + strings.Repeat("=", n) + strings.Repeat(" ", width-n) + "] ")
	}
	fmt.Fprintf(&sb, "%3.0f%% %s/%s files %d/%d", frac*100, formatBytes(p.BytesDone), formatBytes(p.BytesTotal), p.FilesDone, p.FilesTotal)
	var rate float64
	if s := p.Elapsed.Seconds(); s > 0 {
		rate = float64(p.BytesDone) / s
	}
	fmt.Fprintf(&sb, " %s/s", formatBytes(int64(rate)))
	if rate > 0 && p.BytesTotal > p.BytesDone && p.Phase != PhaseDone {
		eta := time.Duration(float64(p.BytesTotal-p.BytesDone) / rate * float64(time.Second))
		fmt.Fprintf(&sb, " eta %s", eta.Round(time.Second))
	}
	fmt.Fprintf(&sb, " elapsed %s", p.Elapsed.Round(time.Millisecond))
	return sb.String()
}

func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
