package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"html"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"cairn/internal/app/dashboard/dashboardtest"
)

var screenshots = flag.String("cairn.screenshots", "", "write the screenshot of TestReportInBrowser (drill.html at 1280 px) to this directory")

// fixtureSum is the state checksum in testdata/drill.json: above 2^53, so a
// JavaScript number would round it (to 5840507790559914000).
const fixtureSum = "5840507790559914352"

// loadFixture reads testdata/drill.json, the report of a real drill (16 MiB
// of state, chain 4, downloads limited to 8 MiB/s).
func loadFixture(t *testing.T) *Report {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "drill.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("testdata/drill.json: %v", err)
	}
	return &r
}

func TestVerdict(t *testing.T) {
	r := loadFixture(t)
	want := "incremental vs full, restored from the store at 8.0MiB/s (the drill's limit): 3.0× faster to take (p50 29ms vs 88ms; 815.3KiB vs 7.3MiB uploaded), 2.5× slower to restore (2.17s vs 884ms); from the local disk 13ms"
	if got := r.Verdict(); got != want {
		t.Errorf("verdict\n got %s\nwant %s", got, want)
	}
	// A differing state comes first; without both store rows there is no
	// comparison to make.
	r.Scenarios[1].StateEqual = false
	r.Scenarios = r.Scenarios[1:3]
	if got := r.Verdict(); !strings.HasPrefix(got, "RESTORED STATE DIFFERS in store-full; 2 restores: store-full 884ms, local-disk 13ms") {
		t.Errorf("verdict with a differing state and no incremental store row: %s", got)
	}
}

// cells reads the terminal table: per scenario, the cells by column name.
func cells(t *testing.T, table string) map[string]map[string]string {
	t.Helper()
	sep := regexp.MustCompile(`\s{2,}`)
	var head []string
	rows := map[string]map[string]string{}
	for _, line := range strings.Split(table, "\n") {
		f := sep.Split(strings.TrimSpace(line), -1)
		if len(f) < 10 {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		if len(f) != len(head) {
			t.Fatalf("table row %q has %d cells, the header %d", line, len(f), len(head))
		}
		m := map[string]string{}
		for i, h := range head {
			m[h] = f[i]
		}
		rows[m["scenario"]] = m
	}
	return rows
}

// TestReportHTML renders drill.html from the fixture: a page of its own
// (no dashboard widgets, no script, no request), every scenario with the
// same predicted time and Δ as the terminal table, the verdict, and the
// 64-bit checksum exact.
func TestReportHTML(t *testing.T) {
	r := loadFixture(t)
	page, err := r.HTML()
	if err != nil {
		t.Fatal(err)
	}
	doc := string(page)
	var table bytes.Buffer
	r.Table(&table)
	term := cells(t, table.String())

	if !strings.Contains(doc, html.EscapeString(r.Verdict())) {
		t.Errorf("the page lacks the verdict %q", r.Verdict())
	}
	if !strings.Contains(table.String(), "verdict: "+r.Verdict()) {
		t.Errorf("the table lacks the verdict")
	}
	cell := func(name, col string) string {
		re := regexp.MustCompile(`(?s)<tr data-scenario="` + regexp.QuoteMeta(name) + `">.*?data-col="` + col + `"[^>]*>([^<]*)<`)
		m := re.FindStringSubmatch(doc)
		if m == nil {
			t.Errorf("scenario %s: no %s cell in the page", name, col)
			return ""
		}
		return html.UnescapeString(m[1])
	}
	if len(r.Scenarios) != 6 {
		t.Fatalf("fixture has %d scenarios, want 6", len(r.Scenarios))
	}
	for _, s := range r.Scenarios {
		row, ok := term[s.Name]
		if !ok {
			t.Errorf("scenario %s: no row in the table", s.Name)
			continue
		}
		for col, termCol := range map[string]string{"predicted": "predicted", "measured": "restore", "delta": "Δ", "state": "state"} {
			if got, want := cell(s.Name, col), row[termCol]; got != want {
				t.Errorf("scenario %s: page %s %q, table %q", s.Name, col, got, want)
			}
		}
	}
	// The local restore predicts its open time (13ms), not the store's
	// download of the checkpoint's full state (the old page's 2.07s).
	if got := cell("local-disk", "predicted"); got != "13ms" {
		t.Errorf("local-disk predicted %q, want 13ms", got)
	}
	if got := cell("store-incremental", "delta"); got != "+5%" {
		t.Errorf("store-incremental Δ %q, want +5%%", got)
	}
	if got := cell("store-full", "delta"); got != "-6%" {
		t.Errorf("store-full Δ %q, want -6%%", got)
	}

	// The checksum: in the text and in the inlined data, as a string.
	if !strings.Contains(doc, `data-digest="sum">`+fixtureSum+`<`) {
		t.Errorf("the page does not show the checksum %s", fixtureSum)
	}
	m := regexp.MustCompile(`(?s)<script type="application/json" id="drill-data">(.*?)</script>`).FindStringSubmatch(doc)
	if m == nil {
		t.Fatal("no inlined data")
	}
	var data struct {
		Verdict string `json:"verdict"`
		Report  struct {
			State struct {
				Sum any `json:"sum"`
			} `json:"state_before_kill"`
			JobStateBytes any `json:"job_state_bytes"`
			Scenarios     []struct {
				Name            string `json:"name"`
				BytesDownloaded any    `json:"bytes_downloaded"`
			} `json:"scenarios"`
		} `json:"report"`
	}
	if err := json.Unmarshal([]byte(m[1]), &data); err != nil {
		t.Fatalf("inlined data: %v", err)
	}
	if data.Report.State.Sum != fixtureSum {
		t.Errorf("inlined checksum %#v, want the string %s", data.Report.State.Sum, fixtureSum)
	}
	if data.Report.JobStateBytes != "22596209" || data.Report.Scenarios[0].BytesDownloaded != "18599588" {
		t.Errorf("inlined byte counts %#v, %#v: want strings", data.Report.JobStateBytes, data.Report.Scenarios[0].BytesDownloaded)
	}
	if data.Verdict != r.Verdict() {
		t.Errorf("inlined verdict %q", data.Verdict)
	}

	// A page of its own: nothing of the live dashboard, nothing fetched.
	for _, bad := range []string{"<script src", "<script>", "fetch(", "http://", "https://", "<link ", "@import", "url(",
		"waiting for data", "watermark", " ago", "/api/", "data-action"} {
		if strings.Contains(doc, bad) {
			t.Errorf("drill.html contains %q", bad)
		}
	}
}

// TestDigestJSON keeps drill.json's checksums exact for a JavaScript reader
// (the dashboard shows drill.json): they are strings, and read back.
func TestDigestJSON(t *testing.T) {
	d := digest{Entries: 3, Sum: 1<<64 - 59, Xor: 1<<53 + 1}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"entries":3,"sum":"18446744073709551557","xor":"9007199254740993"}`; string(b) != want {
		t.Errorf("digest JSON %s, want %s", b, want)
	}
	var back digest
	if err := json.Unmarshal(b, &back); err != nil || back != d {
		t.Errorf("digest read back %+v (%v), want %+v", back, err, d)
	}
}

// TestReportInBrowser opens drill.html from a file in headless Chromium at
// 1280 px: no element is wider than the window or reaches past its right
// edge, the tables fit their boxes (which would scroll on a narrower
// window) with nothing cut, and the checksum read by
// JavaScript from the inlined data is exact. With -cairn.screenshots DIR it
// writes DIR/drill-report.png.
func TestReportInBrowser(t *testing.T) {
	chromium := dashboardtest.RequireChromium(t)
	page, err := loadFixture(t).HTML()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "drill.html")
	if err := os.WriteFile(path, page, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := dashboardtest.Open(ctx, chromium, "file://"+path, 1280, 900)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.WaitFor(ctx, `document.readyState === "complete" && document.getElementById("drill-data")`); err != nil {
		t.Fatal(err)
	}
	var width int
	if err := b.Eval(ctx, "window.innerWidth", &width); err != nil {
		t.Fatal(err)
	}
	if width != 1280 {
		t.Fatalf("window is %d px wide, want 1280", width)
	}
	var wide []string
	if err := b.Eval(ctx, `(() => {
		const out = [];
		const root = document.documentElement;
		if (root.scrollWidth > innerWidth) out.push("document scrollWidth " + root.scrollWidth);
		for (const e of document.querySelectorAll(".box")) {
			if (e.scrollWidth > e.clientWidth) out.push(e.firstElementChild.id + " is cut: " + e.scrollWidth + "px in a " + e.clientWidth + "px box");
		}
		for (const e of document.querySelectorAll("body *")) {
			const r = e.getBoundingClientRect();
			if (r.width > innerWidth || r.right > innerWidth + 0.5) out.push(e.tagName + (e.id ? "#" + e.id : "") + " " + Math.round(r.width) + "px wide, right edge " + Math.round(r.right));
		}
		return out;
	})()`, &wide); err != nil {
		t.Fatal(err)
	}
	for _, w := range wide {
		t.Errorf("at 1280 px: %s", w)
	}
	var sum string
	if err := b.Eval(ctx, `JSON.parse(document.getElementById("drill-data").textContent).report.state_before_kill.sum`, &sum); err != nil {
		t.Fatal(err)
	}
	if sum != fixtureSum {
		t.Errorf("checksum read by JavaScript %q, want %s", sum, fixtureSum)
	}
	var text string
	if err := b.Eval(ctx, `document.body.innerText`, &text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{fixtureSum, "store-incremental", "rescaled-full-1", "3.0× faster to take"} {
		if !strings.Contains(text, want) {
			t.Errorf("the page's text lacks %q", want)
		}
	}
	if *screenshots != "" {
		if err := os.MkdirAll(*screenshots, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(*screenshots, "drill-report.png")
		if err := b.Screenshot(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}
}
