package e2e

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// hostTicks is the machine's CPU time so far as /proc/stat counts it, in
// clock ticks: all of it, and the steal (time the hypervisor ran other
// guests while this one had work). ok is false where there is no
// /proc/stat.
type hostTicks struct {
	steal, total uint64
	ok           bool
}

func readHostTicks() hostTicks {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return hostTicks{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return hostTicks{}
	}
	return parseCPULine(sc.Text())
}

// parseCPULine reads /proc/stat's first line: "cpu  user nice system idle
// iowait irq softirq steal guest guest_nice" (guest time is also counted
// in user, so it is not added again).
func parseCPULine(line string) hostTicks {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return hostTicks{}
	}
	var t hostTicks
	for i, s := range f[1:9] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return hostTicks{}
		}
		t.total += n
		if i == 7 {
			t.steal = n
		}
	}
	t.ok = true
	return t
}

// reportSteal reports steal-%: the share of the machine's CPU time since
// t0 that the hypervisor gave to other guests. Figures of a run with
// steal are not measurements of a goal (BENCHMARKS.md, "Machines").
func reportSteal(b *testing.B, t0 hostTicks) {
	t1 := readHostTicks()
	if !t0.ok || !t1.ok || t1.total <= t0.total {
		return
	}
	b.ReportMetric(100*float64(t1.steal-t0.steal)/float64(t1.total-t0.total), "steal-%")
}

func TestParseCPULine(t *testing.T) {
	got := parseCPULine("cpu  2352458 1560 323617 4644683 40989 0 25392 226242 0 0")
	want := hostTicks{steal: 226242, total: 2352458 + 1560 + 323617 + 4644683 + 40989 + 0 + 25392 + 226242, ok: true}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 3", "cpu0 1 2 3 4 5 6 7 8 9 10", "cpu 1 2 x 4 5 6 7 8"} {
		if got := parseCPULine(bad); got.ok {
			t.Errorf("%q parsed: %+v", bad, got)
		}
	}
}
