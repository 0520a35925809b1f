// Package procs sets how many threads run Go code in a cairn process.
package procs

import (
	"os"
	"runtime"
	"sync/atomic"
)

// spareProcs is how many Ps cairn adds above the CPU count: room for
// goroutines blocked in disk system calls (a checkpoint's fsyncs and
// copies, Pebble's flushes and compactions, the embedded server's
// writes) while the slots, the source and the server keep running.
//
// Go hands a P blocked in a system call to another thread only when its
// monitor notices, up to 10 ms later once the monitor has backed off in a
// busy process. With as many Ps as cores (2 on the edge machines cairn is
// for), two fsyncs held both Ps and stalled every slot and the embedded
// NATS server for that long at each checkpoint. BenchmarkLatency at
// 20,000/s, incremental checkpoints every 1 s, data on disk, interleaved:
// p99 13–24 ms and max 30–66 ms with 2 Ps, 6.0–9.1 ms and 19–35 ms with
// two more (docs/bench/latency.md, "The tail on disk was Go's scheduler";
// docs/RATIONALE.md "Two Ps more than the CPUs").
const spareProcs = 2

// Tune raises GOMAXPROCS to the CPU count + spareProcs and
// returns the value it leaves. It changes nothing when the GOMAXPROCS
// environment variable is set (the operator decided), or when Go's default
// is below the CPU count: that default comes from a container's CPU quota,
// and more runnable threads than the quota would be throttled by the
// kernel for the rest of its period, a longer stall than the one avoided.
func Tune() int {
	before := runtime.GOMAXPROCS(0)
	n := tuneProcs(os.Getenv("GOMAXPROCS") != "", before, runtime.NumCPU(), runtime.GOMAXPROCS)
	if n != before {
		cpuBound.Store(int64(before))
	}
	return n
}

// cpuBound is GOMAXPROCS as it was before Tune raised it (0: not raised).
var cpuBound atomic.Int64

// CPUs is how many goroutines CPU-bound work should run at once (a full
// checkpoint's compression, a restore's rebuild, and the restore model's
// count of them): the Ps Go would have had, not the spare ones Tune adds
// for goroutines blocked in the kernel. Without Tune, GOMAXPROCS.
func CPUs() int {
	if n := cpuBound.Load(); n > 0 {
		return int(n)
	}
	return runtime.GOMAXPROCS(0)
}

func tuneProcs(envSet bool, current, cpus int, set func(int) int) int {
	if envSet || current < cpus {
		return current
	}
	want := cpus + spareProcs
	if current >= want {
		return current
	}
	set(want)
	return want
}
