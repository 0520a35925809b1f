package drill

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// phaseProgress reports one drill phase the way recovery.ProgressPrinter
// reports a restore: on a terminal one bar redrawn in place with throughput
// and ETA; otherwise a plain line at most every 5 seconds, plus the last.
type phaseProgress struct {
	w     io.Writer
	tty   bool
	name  string
	unit  string // "msgs", "B"
	total int64
	start time.Time
	done  atomic.Int64

	stopOnce sync.Once
	stopCh   chan struct{}
	wg       sync.WaitGroup
}

// startPhase starts reporting a phase of total units (0: unknown).
func startPhase(w io.Writer, tty bool, name, unit string, total int64) *phaseProgress {
	p := &phaseProgress{w: w, tty: tty, name: name, unit: unit, total: total, start: time.Now(), stopCh: make(chan struct{})}
	if w == nil {
		return p
	}
	every := 5 * time.Second
	if tty {
		every = 200 * time.Millisecond
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stopCh:
				return
			case <-t.C:
				p.print(false)
			}
		}
	}()
	return p
}

// set records progress (units done so far).
func (p *phaseProgress) set(n int64) { p.done.Store(n) }

// add records n more units done.
func (p *phaseProgress) add(n int64) { p.done.Add(n) }

// finish stops the reports and prints the final line.
func (p *phaseProgress) finish() {
	p.stopOnce.Do(func() {
		close(p.stopCh)
		p.wg.Wait()
		if p.w != nil {
			p.print(true)
		}
	})
}

func (p *phaseProgress) print(final bool) {
	line := formatPhase(p.name, p.unit, p.done.Load(), p.total, time.Since(p.start), p.tty, final)
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		if final {
			fmt.Fprintln(p.w)
		}
		return
	}
	fmt.Fprintln(p.w, line)
}

// formatPhase renders one progress line.
func formatPhase(name, unit string, done, total int64, elapsed time.Duration, bar, final bool) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-22s ", name)
	frac := 0.0
	if total > 0 {
		frac = min(1, float64(done)/float64(total))
	}
	if bar {
		const width = 30
		n := int(frac * width)
		sb.WriteString("[" + strings.Repeat("=", n) + strings.Repeat(" ", width-n) + "] ")
	}
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(done) / s
	}
	fmt.Fprintf(&sb, "%3.0f%% %s/%s %s/s", frac*100, fmtUnit(done, unit), fmtUnit(total, unit), fmtUnit(int64(rate), unit))
	if !final && rate > 0 && total > done {
		fmt.Fprintf(&sb, " eta %s", time.Duration(float64(total-done)/rate*float64(time.Second)).Round(time.Second))
	}
	fmt.Fprintf(&sb, " elapsed %s", elapsed.Round(time.Millisecond))
	return sb.String()
}

func fmtUnit(n int64, unit string) string {
	if unit == "B" {
		return fmtBytes(n)
	}
	switch {
	case n >= 10_000_000:
		return fmt.Sprintf("%.1fM %s", float64(n)/1e6, unit)
	case n >= 10_000:
		return fmt.Sprintf("%.1fk %s", float64(n)/1e3, unit)
	}
	return fmt.Sprintf("%d %s", n, unit)
}

// fmtBytes is n in binary units.
func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
