package dashboard

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"cairn/internal/app/dashboard/dashboardtest"
)

// presenterSource is the fake source with a supervisor's presenter numbers;
// each action changes them as the demo's would.
func presenterSource() (*fakeSource, map[string]func(*http.Request) (int, string)) {
	src := newFakeSource()
	src.snap.Presenter = &Presenter{
		Simulates:  "512.0 MiB of keyed state, bulk-loaded; the checkpoint store behind a 25MB/s link, 20ms per request",
		StateBytes: 553 << 20, CheckpointP50: 0.136, StoreRestore: 25.08, LocalRestore: 0.052, OnlineFirst: 0.3,
		Budget:  "recovery budget from the checkpoint duration: 136ms; from a restore from the store: 25.1s predicted (184× more)",
		Storage: &Storage{Retained: 560 << 20, Logical: 553 << 20, Checkpoints: 3, RetainOne: 554 << 20, SavedByOne: 6 << 20},
	}
	now := time.Now()
	for i := range 120 {
		src.snap.Series = append(src.snap.Series, Sample{TimeMs: now.Add(time.Duration(i-120) * time.Second).UnixMilli(),
			RecordsIn: uint64(i * 1000), RecordsOut: uint64(i * 8000), Lag: uint64(i % 40 * 100)})
	}
	set := func(f func(p *Presenter)) {
		src.mu.Lock()
		defer src.mu.Unlock()
		p := *src.snap.Presenter
		f(&p)
		src.snap.Presenter = &p
	}
	fail := func(kind string, online bool, pred, restored, first, local float64) *Failure {
		return &Failure{Kind: kind, TimeMs: time.Now().UnixMilli(), CheckpointID: 41, Mode: "incremental", Chain: 40,
			BytesDownloaded: 553 << 20, Predicted: pred, Restored: restored, FirstOutput: first, FullyLocal: local, CaughtUp: restored + 3,
			Online: online, Lines: []string{kind + ": killed the job process (pid 4242)", "restoring checkpoint #41 (incremental, chain 40)"}}
	}
	actions := map[string]func(*http.Request) (int, string){
		"kill": func(*http.Request) (int, string) {
			set(func(p *Presenter) { p.Last = fail("kill -9", false, 0.057, 0.043, 0.8, 0) })
			return 200, "kill -9: killed the job process (pid 4242)"
		},
		"lose-disk": func(*http.Request) (int, string) {
			set(func(p *Presenter) { p.Last = fail("lost the disk", false, 22.2, 25.5, 30.5, 0) })
			return 200, "lose the disk: killed the job process and deleted its data directory"
		},
		"lose-disk-online": func(*http.Request) (int, string) {
			set(func(p *Presenter) { p.Last = fail("lost the disk, online restore", true, 0.3, 0.094, 0.9, 31.5) })
			return 200, "lose the disk: it restarts from the store online"
		},
		"full-checkpoint": func(*http.Request) (int, string) {
			set(func(p *Presenter) {
				p.ChainVsFull = &ChainVsFull{ChainID: 44, Chain: 43, ChainFiles: 61, ChainRestore: 25.1, FullID: 45, FullRestore: 27.9, ChainMeasured: 25.5}
			})
			return 200, "full checkpoint 45 committed"
		},
		"rescale-preview": func(r *http.Request) (int, string) {
			n := r.URL.Query().Get("slots")
			set(func(p *Presenter) {
				p.Rescale = &Rescale{FromSlots: 2, ToSlots: 3, BytesPerSlot: []int64{263 << 20, 528 << 20, 265 << 20}, Predicted: 22.2,
					Preview: "rescale 2 → " + n + " slots of checkpoint #45: slot 0: 263 MiB from the store"}
			})
			return 200, "preview: rescale 2 → " + n + " slots"
		},
		"rescale": func(r *http.Request) (int, string) {
			set(func(p *Presenter) { p.Rescale.Measured = 24.4 })
			return 200, "rescale: it restarts on " + r.URL.Query().Get("slots") + " slots"
		},
	}
	return src, actions
}

// TestBrowserPresenter opens the presenter view in headless Chromium at a
// projector's 1280×720, presses every one of its buttons and checks what it
// shows after each: the answer, the last failure's numbers, the comparisons;
// then it reloads the page and finds the server's chart history drawn, and
// goes back to the normal view.
func TestBrowserPresenter(t *testing.T) {
	chromium := dashboardtest.RequireChromium(t)
	src, actions := presenterSource()
	url := serve(t, src, Options{Actions: actions})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := dashboardtest.Open(ctx, chromium, url+"/#presenter", 1280, 720)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.WaitFor(ctx, `document.body.classList.contains('presenting') && document.getElementById('pStore').textContent !== '—'`); err != nil {
		t.Fatal(err)
	}
	text := func(id string) string {
		t.Helper()
		var s string
		if err := b.Eval(ctx, `document.getElementById('`+id+`').textContent`, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	for id, want := range map[string]string{
		"pCheckpoint": "136 ms", "pStore": "25.1 s", "pLocal": "52.0 ms", "pBudget": "184× more",
		"pSimulates": "25MB/s link", "pStorage": "560 MiB / 553 MiB", "pStorageS": "would free 6.00 MiB",
	} {
		if got := text(id); !strings.Contains(got, want) {
			t.Errorf("presenter %s shows %q, want %q in it", id, got, want)
		}
	}
	// Readable on a projector: the two numbers large, and side by side
	// within the first screen.
	var layout struct {
		Font                     float64
		CkTop, StoreTop, Bottom  float64
		NormalHidden, MainHidden bool
	}
	if err := b.Eval(ctx, `(() => { const c = document.getElementById('pCheckpoint').getBoundingClientRect(), s = document.getElementById('pStore').getBoundingClientRect();
	  return { Font: parseFloat(getComputedStyle(document.getElementById('pStore')).fontSize), CkTop: c.top, StoreTop: s.top,
	    Bottom: document.getElementById('pBudget').getBoundingClientRect().bottom, MainHidden: getComputedStyle(document.querySelector('main')).display === 'none' }; })()`, &layout); err != nil {
		t.Fatal(err)
	}
	if layout.Font < 40 || layout.CkTop != layout.StoreTop || layout.Bottom > 720 || !layout.MainHidden {
		t.Errorf("presenter layout at 1280×720: %+v; want numbers of at least 40px side by side, the budget line on the first screen, the normal view hidden", layout)
	}

	press := func(action, wantMsg string) {
		t.Helper()
		if err := b.Eval(ctx, `document.querySelector('#pButtons button[data-paction="`+action+`"]').click()`, nil); err != nil {
			t.Fatal(err)
		}
		if err := b.WaitFor(ctx, `document.getElementById('pMsg').textContent.includes(`+jsString(wantMsg)+`)`); err != nil {
			t.Fatalf("after pressing %s the presenter says %q, want %q", action, text("pMsg"), wantMsg)
		}
	}
	waitText := func(id, want string) {
		t.Helper()
		if err := b.WaitFor(ctx, `document.getElementById('`+id+`').textContent.includes(`+jsString(want)+`)`); err != nil {
			t.Errorf("presenter %s shows %q, want %q in it", id, text(id), want)
		}
	}

	press("kill", "kill -9: killed")
	waitText("pFailureTitle", "kill -9")
	waitText("pfRestored", "43.0 ms")
	waitText("pfLocal", "n/a")

	press("lose-disk", "lose the disk")
	waitText("pFailureTitle", "lost the disk")
	waitText("pfPredicted", "22.2 s")
	waitText("pfRestored", "25.5 s")
	waitText("pfRestoredS", "+15% off the prediction")
	waitText("pfLines", "restoring checkpoint #41")

	press("lose-disk-online", "online")
	waitText("pFailureTitle", "online restore")
	waitText("pfFirst", "900 ms")
	waitText("pfLocal", "31.5 s")

	press("full-checkpoint", "full checkpoint 45")
	waitText("pChain", "25.1 s vs 27.9 s")
	waitText("pChainS", "chain of 43")

	if err := b.Eval(ctx, `document.getElementById('pSlots').value = '3'`, nil); err != nil {
		t.Fatal(err)
	}
	press("rescale-preview", "preview: rescale 2 → 3")
	waitText("pRescale", "22.2 s / —")
	waitText("pRescaleS", "263 MiB from the store")
	press("rescale", "restarts on 3 slots")
	waitText("pRescale", "22.2 s / 24.4 s")

	// A reload keeps the charts: the server's history, not the page's.
	if err := b.Eval(ctx, `window.beforeReload = true; location.reload()`, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitFor(ctx, `!window.beforeReload && document.body.classList.contains('presenting') && document.getElementById('pfLocal').textContent.includes('31.5')`); err != nil {
		t.Errorf("after a reload the presenter view lost the last failure: %q", text("pFailureTitle"))
	}
	if err := b.Eval(ctx, `document.querySelector('#pButtons button[data-paction="normal"]').click()`, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitFor(ctx, `!document.body.classList.contains('presenting') && +document.getElementById('c-lag').getAttribute('data-points') >= 100`); err != nil {
		var pts string
		_ = b.Eval(ctx, `document.getElementById('c-lag').getAttribute('data-points')`, &pts)
		t.Errorf("the normal view after a reload: lag chart has %s points, want the server's history (>= 100)", pts)
	}
	if t.Failed() {
		dom, _ := b.DOM(ctx)
		writeArtifact(t, "presenter-dom.html", dom)
	}
}

// jsString quotes s for JavaScript.
func jsString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
