package e2e

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cairn/internal/testutil/testbin"
)

var (
	rssDuration = flag.Duration("cairn.rss.duration", time.Minute, "BenchmarkDemoRSS: how long the demo runs")
	rssEvery    = flag.Duration("cairn.rss.every", 10*time.Second, "BenchmarkDemoRSS: sampling period")
	rssArgs     = flag.String("cairn.rss.args", "", "BenchmarkDemoRSS: extra arguments of cairn demo (e.g. --memory off)")
)

// BenchmarkDemoRSS runs `cairn demo` (its defaults: 1,000 lines/s, 2
// slots, --memory 256MiB) as the real binary for -cairn.rss.duration and
// samples the resident memory of its two processes (the supervisor with
// the embedded NATS server, and the job) every -cairn.rss.every: RSS
// (what top shows; the binary's text pages count in both) and PSS (shared
// pages split between them: what the demo costs the machine). It prints
// the curve and reports the maximum and the last sample of the sums.
//
//	go test ./e2e -run '^$' -bench DemoRSS -benchtime 1x -timeout 0 -cairn.rss.duration 10m
func BenchmarkDemoRSS(b *testing.B) {
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		data := filepath.Join(b.TempDir(), "demo")
		args := append([]string{"demo", "--data", data, "--duration", rssDuration.String(), "--http", "off"}, strings.Fields(*rssArgs)...)
		cmd := exec.Command(bin, args...)
		var out lockedBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		dieWithTest(cmd)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var maxRSS, maxPSS, lastRSS, lastPSS int64
		start := time.Now()
		tick := time.NewTicker(*rssEvery)
		fmt.Printf("%8s %12s %12s %12s %12s %12s %12s\n", "t", "sup RSS", "job RSS", "sum RSS", "sup PSS", "job PSS", "sum PSS")
	loop:
		for {
			select {
			case err := <-done:
				if err != nil {
					b.Fatalf("demo: %v\n%s", err, tail(out.String(), 4000))
				}
				break loop
			case <-tick.C:
				sup := cmd.Process.Pid
				job := childOf(sup)
				sr, sp := memOf(sup)
				jr, jp := memOf(job)
				if sr == 0 {
					continue
				}
				lastRSS, lastPSS = sr+jr, sp+jp
				maxRSS, maxPSS = max(maxRSS, lastRSS), max(maxPSS, lastPSS)
				fmt.Printf("%8s %12s %12s %12s %12s %12s %12s\n", time.Since(start).Round(time.Second), mib(sr), mib(jr), mib(lastRSS), mib(sp), mib(jp), mib(lastPSS))
			}
		}
		tick.Stop()
		b.ReportMetric(float64(maxRSS)/(1<<20), "max-RSS-MiB")
		b.ReportMetric(float64(maxPSS)/(1<<20), "max-PSS-MiB")
		b.ReportMetric(float64(lastRSS)/(1<<20), "last-RSS-MiB")
		fmt.Println(tail(out.String(), 600))
	}
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// childOf is a child process of pid (0: none), found by the parent pid in
// /proc/*/stat (a thread's children file lists only that thread's).
func childOf(pid int) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces; cut after ')'.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		f := strings.Fields(rest)
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			return c
		}
	}
	return 0
}

// memOf reads a process's RSS and PSS, in bytes (0, 0: gone).
func memOf(pid int) (rss, pss int64) {
	if pid == 0 {
		return 0, 0
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Rss:":
			rss = n << 10
		case "Pss:":
			pss = n << 10
		}
	}
	return rss, pss
}
