package dashboard

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches /metrics and parses it as the Prometheus text format.
func scrape(t *testing.T, url string) (map[string]*dto.MetricFamily, []byte) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("GET /metrics: Content-Type %q, want the text format", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics is not the Prometheus text format: %v\n%s", err, body)
	}
	return fams, body
}

// value returns the value of the sample of family name whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
	for _, m := range f.Metric {
		if !hasLabels(m, want...) {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	t.Fatalf("metric %s has no sample with labels %v", name, want)
	return 0
}

func hasLabels(m *dto.Metric, kv ...string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, l := range m.Label {
			if l.GetName() == kv[i] && l.GetValue() == kv[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// histogramCount sums the sample counts of a histogram over all its label values.
func histogramCount(t *testing.T, fams map[string]*dto.MetricFamily, name string) uint64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
	if f.GetType() != dto.MetricType_HISTOGRAM {
		t.Fatalf("%s is a %s, want a histogram", name, f.GetType())
	}
	var n uint64
	for _, m := range f.Metric {
		n += m.Histogram.GetSampleCount()
	}
	return n
}

func TestMetrics(t *testing.T) {
	src := newFakeSource()
	srv := httptest.NewServer(Handler(src, Options{}))
	defer srv.Close()

	fams, body := scrape(t, srv.URL)
	last, completed, failed := src.counts()
	snap := src.Snapshot()

	for name, f := range fams {
		switch {
		case strings.HasPrefix(name, "cairn_"):
		case strings.HasPrefix(name, "go_"), strings.HasPrefix(name, "process_"), strings.HasPrefix(name, "promhttp_"):
			continue // the standard runtime collectors
		default:
			t.Errorf("metric %s: want the prefix cairn_", name)
		}
		if strings.HasSuffix(name, "_total") != (f.GetType() == dto.MetricType_COUNTER) {
			t.Errorf("metric %s is a %s: counters, and only counters, end in _total", name, f.GetType())
		}
		if strings.Contains(name, "duration") && !strings.Contains(name, "_last_") && f.GetType() != dto.MetricType_HISTOGRAM {
			t.Errorf("metric %s is a %s, want a histogram of durations", name, f.GetType())
		}
	}
	// promlint checks the Prometheus naming conventions (units, _total, base units).
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "cairn_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}

	if h := fams["cairn_record_latency_seconds"]; h == nil || h.GetType() != dto.MetricType_HISTOGRAM {
		t.Error("/metrics lacks the record latency histogram")
	} else if hm := h.GetMetric()[0].GetHistogram(); hm.GetSampleCount() != 10 || hm.GetSampleSum() != 61 || len(hm.GetBucket()) < 4 ||
		hm.GetBucket()[1].GetCumulativeCount() != 6 || hm.GetBucket()[3].GetCumulativeCount() != 9 {
		t.Errorf("latency histogram %v", hm)
	}
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"cairn_job_info", []string{"job", "clicks-per-user"}, 1},
		{"cairn_slots", nil, 4},
		{"cairn_key_groups", nil, 128},
		{"cairn_records_dead_lettered_total", nil, 17},
		{"cairn_outputs_skipped_total", nil, 1200},
		{"cairn_watermark_timestamp_seconds", nil, float64(snap.Watermark) / 1e3},
		{"cairn_state_size_bytes", []string{"slot", "1"}, 51 * mib},
		{"cairn_checkpoints_total", []string{"result", "completed"}, float64(completed)},
		{"cairn_checkpoints_total", []string{"result", "failed"}, float64(failed)},
		{"cairn_checkpoint_last_id", nil, float64(last.ID)},
		{"cairn_checkpoint_last_timestamp_seconds", nil, float64(last.Time.Unix())},
		{"cairn_checkpoint_last_sync_duration_seconds", nil, last.SyncDuration.Seconds()},
		{"cairn_checkpoint_last_async_duration_seconds", nil, last.AsyncDuration.Seconds()},
		{"cairn_checkpoint_last_uploaded_bytes", nil, float64(last.BytesUploaded)},
		{"cairn_checkpoint_last_full_state_bytes", nil, float64(last.FullStateSize)},
		{"cairn_checkpoint_last_uploaded_files", nil, float64(last.FilesUploaded)},
		{"cairn_checkpoint_last_reused_files", nil, float64(last.FilesReused)},
		{"cairn_checkpoint_last_chain_length", nil, float64(last.ChainLength)},
		{"cairn_checkpoint_retained_exclusive_bytes", nil, float64(last.RetainedExclusive)},
		{"cairn_checkpoint_retained_shared_bytes", nil, float64(last.RetainedShared)},
		{"cairn_checkpoint_last_predicted_restore_seconds", nil, last.PredictedRestore.Seconds()},
		{"cairn_restores_total", []string{"source", "store"}, 2},
		{"cairn_restores_total", []string{"source", "local"}, 1},
		{"cairn_restores_total", []string{"source", "standby"}, 0},
		{"cairn_restore_last_duration_seconds", nil, 6.3},
		{"cairn_restore_last_downloaded_bytes", nil, float64(snap.Restores[2].BytesDownloaded)},
		{"cairn_restore_last_local_bytes", nil, 0},
		{"cairn_restore_last_files", nil, 61},
		{"cairn_restore_last_rescaled", nil, 1},
		{"cairn_restore_last_chain_length", nil, 9},
		{"cairn_restore_last_checkpoint_id", nil, 29},
		{"cairn_standby_lag_checkpoints", nil, 1},
		{"cairn_standby_lag_bytes", nil, 6 * mib},
		{"cairn_standby_last_synced_checkpoint_id", nil, 29},
	}
	for _, c := range checks {
		if got := value(t, fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if in := value(t, fams, "cairn_records_in_total"); in < 1_250_000 {
		t.Errorf("cairn_records_in_total = %v, want at least the source's count", in)
	}
	if lag := value(t, fams, "cairn_consumer_lag_messages"); lag < 12_000 {
		t.Errorf("cairn_consumer_lag_messages = %v, want StreamLastSeq - ProcessedSeq >= 12000", lag)
	}
	for _, h := range []string{"cairn_checkpoint_sync_duration_seconds", "cairn_checkpoint_async_duration_seconds"} {
		if n := histogramCount(t, fams, h); n != uint64(completed) {
			t.Errorf("%s count = %d, want %d (each completed checkpoint once)", h, n, completed)
		}
	}
	if n := value(t, fams, "cairn_checkpoint_sync_duration_seconds", "mode", "full"); n != 3 {
		t.Errorf("cairn_checkpoint_sync_duration_seconds{mode=full} count = %v, want 3", n)
	}
	if n := histogramCount(t, fams, "cairn_restore_duration_seconds"); n != 3 {
		t.Errorf("cairn_restore_duration_seconds count = %d, want 3", n)
	}

	// A second scrape observes nothing twice; a new checkpoint is observed once.
	fams, _ = scrape(t, srv.URL)
	if n := histogramCount(t, fams, "cairn_checkpoint_sync_duration_seconds"); n != uint64(completed) {
		t.Errorf("after a second scrape: sync histogram count = %d, want %d", n, completed)
	}
	src.addCheckpoint(Checkpoint{ID: 31, Mode: "incremental", Time: last.Time.Add(10 * time.Second),
		SyncDuration: 7 * time.Millisecond, AsyncDuration: 300 * time.Millisecond, BytesUploaded: 9 * mib, FullStateSize: 230 * mib})
	fams, _ = scrape(t, srv.URL)
	if n := histogramCount(t, fams, "cairn_checkpoint_async_duration_seconds"); n != uint64(completed+1) {
		t.Errorf("after a new checkpoint: async histogram count = %d, want %d", n, completed+1)
	}
	if got := value(t, fams, "cairn_checkpoints_total", "result", "completed"); got != float64(completed+1) {
		t.Errorf("after a new checkpoint: cairn_checkpoints_total{result=completed} = %v, want %d", got, completed+1)
	}
	if got := value(t, fams, "cairn_checkpoint_last_uploaded_bytes"); got != 9*mib {
		t.Errorf("after a new checkpoint: cairn_checkpoint_last_uploaded_bytes = %v, want %v", got, 9*mib)
	}
	if bytes.Contains(body, []byte("hunter2")) {
		t.Error("/metrics shows a secret")
	}
}

// TestMetricsEmpty: a job that has just started, with no checkpoint, no restore and no
// watermark, exports no made-up last values and still zero counters.
func TestMetricsEmpty(t *testing.T) {
	src := &fakeSource{snap: Snapshot{Job: "j", Slots: 1, KeyGroups: 8, Watermark: minWatermark}}
	srv := httptest.NewServer(Handler(src, Options{}))
	defer srv.Close()
	fams, _ := scrape(t, srv.URL)
	for _, name := range []string{"cairn_watermark_timestamp_seconds", "cairn_checkpoint_last_id", "cairn_restore_last_duration_seconds", "cairn_standby_lag_bytes"} {
		if _, ok := fams[name]; ok {
			t.Errorf("%s exported without data", name)
		}
	}
	if got := value(t, fams, "cairn_checkpoints_total", "result", "failed"); got != 0 {
		t.Errorf("cairn_checkpoints_total{result=failed} = %v, want 0", got)
	}
	if got := value(t, fams, "cairn_restores_total", "source", "store"); got != 0 {
		t.Errorf("cairn_restores_total{source=store} = %v, want 0", got)
	}
}

// stageSource is a fakeSource that counts records per stage.
type stageSource struct {
	*fakeSource
	stages []StageStats
}

func (s stageSource) StageStats() []StageStats { return s.stages }

// TestStageMetrics: a StageSource's stages are exported with their
// sub-topology and stage labels, as counters that pass promlint; a Source
// that is not one exports none.
func TestStageMetrics(t *testing.T) {
	src := stageSource{newFakeSource(), []StageStats{
		{SubTopology: "wc", Stage: "split", RecordsIn: 10, RecordsOut: 31, DeadLetters: 2},
		{SubTopology: "wc", Stage: "count", Keyed: true, RecordsIn: 29, RecordsOut: 29},
		{SubTopology: "wc.s1", Stage: "top", Keyed: true, RecordsIn: 29, RecordsOut: 3, DeadLetters: 1},
	}}
	srv := httptest.NewServer(Handler(src, Options{}))
	defer srv.Close()
	fams, body := scrape(t, srv.URL)
	for _, st := range src.stages {
		for name, want := range map[string]uint64{
			"cairn_stage_records_in_total":            st.RecordsIn,
			"cairn_stage_records_out_total":           st.RecordsOut,
			"cairn_stage_records_dead_lettered_total": st.DeadLetters,
		} {
			if f := fams[name]; f.GetType() != dto.MetricType_COUNTER {
				t.Errorf("%s is a %s, want a counter", name, f.GetType())
			}
			if got := value(t, fams, name, "sub_topology", st.SubTopology, "stage", st.Stage); got != float64(want) {
				t.Errorf("%s{sub_topology=%q,stage=%q} = %v, want %d", name, st.SubTopology, st.Stage, got, want)
			}
		}
	}
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "cairn_stage_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}

	plain := httptest.NewServer(Handler(newFakeSource(), Options{}))
	defer plain.Close()
	fams, _ = scrape(t, plain.URL)
	if _, ok := fams["cairn_stage_records_in_total"]; ok {
		t.Error("a Source that counts no stage exports cairn_stage_records_in_total")
	}
}
