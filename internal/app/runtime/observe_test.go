package runtime

import (
	"context"
	"math"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/runtime/online"
	"cairn/internal/base/natsembed"
	"cairn/recovery"
	"cairn/recovery/model"
	"cairn/state"
)

// TestObserveOnlineRestore: an online restore calibrates the model — its
// time to processing the remote term (time beyond the open and the metadata
// downloads, per SST left in the store), its finished background download the store bandwidth
// (unless a rate cap set the pace) — and the next online restore is
// predicted from them.
func TestObserveOnlineRestore(t *testing.T) {
	m := model.New()
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	m.SetClock(func() time.Time { return now })
	rs := state.NewRemoteSet()
	defer rs.Close()
	dir := t.TempDir()
	for _, name := range []string{"000001.sst", "000002.sst"} {
		if err := rs.Add(filepath.Join(dir, name), state.RemoteObject{Name: name, Size: 4 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	res := &recovery.Result{Mode: checkpoint.ModeIncremental, FromSlots: 2, ToSlots: 2, Duration: 50 * time.Millisecond,
		FilesRemote: 2, BytesRemote: 8 << 20, FilesDownloaded: 2, BytesDownloaded: 4096, Remote: rs}

	// Without an open time nothing is predicted; the restore is a sample
	// of the online terms all the same.
	if p := observeOnlineRestore(m, res); p != 0 || !m.Terms()[model.TermOnlineOpen].Known() {
		t.Fatalf("without an open time: predicted %v, terms %+v", p, m.Terms())
	}
	if _, err := m.ObserveRestore(model.Input{Mode: model.Incremental, Source: model.SourceLocal}, 20*time.Millisecond, "test"); err != nil {
		t.Fatal(err)
	}
	if p := observeOnlineRestore(m, res); p != 0 {
		t.Fatalf("predicted %v before any remote term or bandwidth was measured", p)
	}
	// Two samples of 50 ms (less the 2 metadata downloads at the
	// per-object latency, not measured: 0): the online open is the 20 ms
	// open, and the rest is per remote SST, over 2.
	if r := m.Terms()[model.TermRemote]; !r.Known() || math.Abs(r.Value-0.015) > 1e-9 || r.From != "online restore" {
		t.Fatalf("remote term %+v, want 15 ms per remote SST", r)
	}

	// A download capped by restore.online_rate measures the cap.
	if observeOnlineDownload(m, res, 2*time.Second, 1<<20) || m.Terms()[model.TermBandwidth].Known() {
		t.Fatal("a rate-capped download calibrated the bandwidth")
	}
	if observeOnlineDownload(m, res, 0, 0) {
		t.Fatal("a download not finished calibrated the bandwidth")
	}
	if !observeOnlineDownload(m, res, 2*time.Second, 0) {
		t.Fatal("the finished download was not recorded")
	}
	if bw := m.Terms()[model.TermBandwidth]; !bw.Known() || math.Abs(bw.Value-4<<20) > 1 {
		t.Fatalf("bandwidth %+v, want 8 MiB in 2 s", bw)
	}
	st := m.State()
	if tr := st.Transfers[len(st.Transfers)-1]; tr.Objects != 2 || tr.Parallelism != online.Concurrency || tr.From != "online restore" {
		t.Fatalf("transfer %+v", tr)
	}

	// The next online restore is predicted: 20 ms open + 2 × 15 ms.
	if p := observeOnlineRestore(m, res); p != 50*time.Millisecond {
		t.Fatalf("predicted time to processing %v, want 50ms", p)
	}
	if e := restoreEntry(res, 50*time.Millisecond); !e.Online || e.PredictedRestore != 50*time.Millisecond {
		t.Fatalf("restore entry %+v", e)
	}
}

// TestLagUnknownUntilRead: before the observer has read the input
// stream's last sequence from the server, /metrics reports no lag (a lag
// of 0 would tell a watcher the job is caught up while it has not begun);
// after the read, the lag counts the messages not yet processed.
func TestLagUnknownUntilRead(t *testing.T) {
	srv, js := startJetStream(t)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "LINES", Subjects: []string{"lines.>"}}); err != nil {
		t.Fatal(err)
	}
	j := parseJob(t, t.TempDir(), "nats: "+srv.URL()+"\n")
	r, err := Start(context.Background(), j, Options{}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 5 {
		if _, err := js.Publish(context.Background(), "lines.a", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	scrape := func(o *observer) string {
		rec := httptest.NewRecorder()
		dashboard.Handler(o, dashboard.Options{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	o := newObserver(r) // not run: nothing read from the server yet
	if m := scrape(o); strings.Contains(m, "\ncairn_consumer_lag_messages ") {
		t.Fatalf("a lag before the stream was read:\n%s", grepLines(m, "cairn_consumer_lag"))
	}
	o.refresh(context.Background())
	if m := scrape(o); !strings.Contains(m, "\ncairn_consumer_lag_messages 5\n") {
		t.Fatalf("after the read, want a lag of 5 (nothing processed):\n%s", grepLines(m, "cairn_consumer_lag"))
	}
}

// grepLines returns m's lines that start with prefix.
func grepLines(m, prefix string) string {
	var out []string
	for _, l := range strings.Split(m, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// startJetStream starts an embedded server for the test and connects to
// it; both end with the test.
func startJetStream(t *testing.T) (*natsembed.Server, jetstream.JetStream) {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return srv, js
}
