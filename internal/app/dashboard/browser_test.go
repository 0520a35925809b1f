package dashboard

import (
	"context"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn/internal/app/dashboard/dashboardtest"
)

// serve runs Handler on a random loopback port until the test ends.
func serve(t *testing.T, src Source, o Options) string {
	t.Helper()
	ln, err := Listen("127.0.0.1:0", o.Token)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Handler(src, o), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// TestBrowser loads the dashboard in headless Chromium and checks that every chart holds
// the fake source's data points. Run it with Chromium installed (apt-get install
// chromium); under CI=true a missing browser fails the test.
func TestBrowser(t *testing.T) {
	chromium := dashboardtest.RequireChromium(t)
	src := newFakeSource()
	// A job graph's sub-topologies, with the newest graph checkpoint.
	src.snap.SubTopologies = []SubTopology{
		{Name: src.snap.Job, Slots: 2, RecordsIn: 900, RecordsOut: 4000, Watermark: math.MinInt64, GraphCheckpoint: 12, GraphPart: 12},
		{Name: src.snap.Job + ".s1", Slots: 1, RecordsIn: 4000, RecordsOut: 30, Watermark: math.MinInt64, GraphCheckpoint: 12, GraphPart: 11},
	}
	url := serve(t, src, Options{Actions: map[string]func(*http.Request) (int, string){
		"savepoint": func(*http.Request) (int, string) { return 200, "ok" },
	}})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Five seconds of virtual time: about five polls of /api/snapshot.
	dom, err := dashboardtest.DumpDOM(ctx, chromium, url+"/", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	charts := dashboardtest.Charts(dom)
	if testing.Verbose() || t.Failed() {
		for _, c := range charts {
			t.Logf("chart %s: %d points, elements %v", c.Name, c.Points, c.Series)
		}
	}
	_, completed, failed := src.counts()
	total := completed + failed
	snap := src.Snapshot()

	want := []struct {
		chart  string
		points int
		series map[string]int
	}{
		{"checkpoint-bytes", total, map[string]int{"uploaded": completed, "full_state": completed, "failed": failed}},
		{"checkpoint-durations", total, map[string]int{"sync": completed, "async": completed, "predicted_restore": completed}},
		{"retained", total, map[string]int{"exclusive": completed, "shared": completed}},
		{"state", snap.Slots, map[string]int{"state": snap.Slots}},
		{"recovery", len(snap.Restores), map[string]int{"measured": len(snap.Restores), "predicted": len(snap.Restores), "checkpoint": len(snap.Restores)}},
	}
	for _, w := range want {
		c, ok := charts[w.chart]
		if !ok {
			t.Errorf("chart %s missing from the page", w.chart)
			continue
		}
		if c.Points != w.points {
			t.Errorf("chart %s: data-points = %d, want %d", w.chart, c.Points, w.points)
		}
		for s, n := range w.series {
			if c.Series[s] != n {
				t.Errorf("chart %s: %d %q elements, want %d", w.chart, c.Series[s], s, n)
			}
		}
	}
	// The compaction sawtooth: uploads drop after every tooth.
	if up := charts["checkpoint-bytes"].Values["uploaded"]; len(up) == completed {
		drops := 0
		for i := 1; i < len(up); i++ {
			if up[i] < up[i-1]/4 {
				drops++
			}
		}
		if drops < 3 {
			t.Errorf("checkpoint-bytes: uploaded %v shows %d sharp drops, want the sawtooth (>= 3)", up, drops)
		}
	}
	// Live charts need at least two polls: throughput is a rate between polls.
	if c := charts["throughput"]; c.Points < 1 || c.Series["in"] != c.Points || !positive(c.Values["in"]) {
		t.Errorf("chart throughput: %d points, in values %v; want positive rates from several polls", c.Points, c.Values["in"])
	}
	if c := charts["lag"]; c.Points < 2 || !positive(c.Values["lag"]) {
		t.Errorf("chart lag: %d points, values %v; want several polls", c.Points, c.Values["lag"])
	}
	for _, text := range []string{"clicks-per-user", "store after incremental", `data-action="savepoint"`, `data-tile="predicted-restore"`, ">live<", `data-tile="latency"`, `data-tile="visibility"`, `data-row="stage-clicks-per-user-count"`, "keyed", "in graph checkpoint", "12 (its 11)"} {
		if !strings.Contains(dom, text) {
			t.Errorf("page is missing %q", text)
		}
	}
	if strings.Contains(dom, "hunter2") {
		t.Error("the page shows a secret from a checkpoint error")
	}
	if t.Failed() {
		writeArtifact(t, "dashboard-dom.html", dom)
	}
}

// TestBrowserStatic opens the page RenderStatic made as a file, without a server.
func TestBrowserStatic(t *testing.T) {
	chromium := dashboardtest.RequireChromium(t)
	src := newFakeSource()
	b, err := RenderStatic(src.Snapshot(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "report.html")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dom, err := dashboardtest.DumpDOM(ctx, chromium, "file://"+path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	charts := dashboardtest.Charts(dom)
	_, completed, failed := src.counts()
	if c := charts["checkpoint-bytes"]; c.Points != completed+failed {
		t.Errorf("static page: checkpoint-bytes has %d points, want %d", c.Points, completed+failed)
	}
	if c := charts["recovery"]; c.Points != 3 {
		t.Errorf("static page: recovery has %d points, want 3", c.Points)
	}
	if !strings.Contains(dom, ">snapshot<") {
		t.Error("static page does not say it is a snapshot")
	}
	if t.Failed() {
		writeArtifact(t, "dashboard-static-dom.html", dom)
	}
}

func positive(vs []float64) bool {
	for _, v := range vs {
		if v > 0 {
			return true
		}
	}
	return false
}

// writeArtifact keeps the DOM of a failed browser test for a look.
func writeArtifact(t *testing.T, name, content string) {
	p := filepath.Join(os.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err == nil {
		t.Logf("DOM written to %s", p)
	}
}
