package runtime

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"cairn/internal/app/dashboard"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime/growth"
)

const mib = 1 << 20

func TestGrowthMessage(t *testing.T) {
	v := growth.Verdict{Samples: 30, BytesPerSecond: 104857.6, WrittenPerSecond: 5000}
	got := growthMessage(job.Stage{Name: "count"}, v, 80*mib)
	for _, s := range []string{"state of stage count grows without bound: missing TTL?", "+104.9 kB/s over the last 30 intervals", "83.9 MB now", "5000 records/s"} {
		if !strings.Contains(got, s) {
			t.Errorf("message lacks %q: %s", s, got)
		}
	}
	got = growthMessage(job.Stage{Name: "count", TTL: time.Hour}, v, 80*mib)
	if !strings.Contains(got, "its ttl 1h0m0s has not bounded it yet") {
		t.Errorf("message with a ttl: %s", got)
	}
}

type growthSource struct{ s dashboard.Snapshot }

func (g growthSource) Snapshot() dashboard.Snapshot { return g.s }

// TestUnboundedMetrics: /metrics exports cairn_state_unbounded{stage} and
// cairn_state_growth_bytes_per_second{stage} (promlint-clean), and
// /api/snapshot carries the detector's and the advisor's fields back
// through DecodeSnapshot.
func TestUnboundedMetrics(t *testing.T) {
	since := time.UnixMilli(1_790_000_000_000)
	src := growthSource{dashboard.Snapshot{Job: "j", Slots: 1, KeyGroups: 8, Watermark: -1 << 63,
		StateGrowth: []dashboard.StateGrowth{
			{Stage: "count", SubTopology: "j", Unbounded: true, Since: since, Message: "state of stage count grows without bound: missing TTL?",
				BytesPerSecond: 104857.6, RecordsPerSecond: 5000, Intervals: 30, StateBytes: 80 * mib},
			{Stage: "dedupe", SubTopology: "j.s1", Intervals: 1, StateBytes: mib},
		},
		Advice: []dashboard.Advice{{Name: "j", Recommend: "full", Text: "state 40.0 MB: ...", IncrementalTook: 100 * time.Millisecond,
			FullTook: 400 * time.Millisecond, IncrementalUploaded: 2e6, FullUploaded: 40e6, FullRestore: 300 * time.Millisecond, StateBytes: 40e6}},
	}}
	srv := httptest.NewServer(dashboard.Handler(src, dashboard.Options{}))
	defer srv.Close()
	get := func(path string) []byte {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	body := get("/metrics")
	for _, s := range []string{`cairn_state_unbounded{stage="count"} 1`, `cairn_state_unbounded{stage="dedupe"} 0`,
		`cairn_state_growth_bytes_per_second{stage="count"} 104857.6`} {
		if !bytes.Contains(body, []byte(s)) {
			t.Errorf("/metrics lacks %s", s)
		}
	}
	if bytes.Contains(body, []byte(`cairn_state_growth_bytes_per_second{stage="dedupe"}`)) {
		t.Error("a growth rate exported from one sample")
	}
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "cairn_state") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
	back, err := dashboard.DecodeSnapshot(get("/api/snapshot"))
	if err != nil {
		t.Fatal(err)
	}
	if len(back.StateGrowth) != 2 || back.StateGrowth[0] != src.s.StateGrowth[0] || back.StateGrowth[1] != src.s.StateGrowth[1] {
		t.Errorf("state growth back from /api/snapshot: %+v, want %+v", back.StateGrowth, src.s.StateGrowth)
	}
	if len(back.Advice) != 1 || back.Advice[0] != src.s.Advice[0] {
		t.Errorf("advice back from /api/snapshot: %+v, want %+v", back.Advice, src.s.Advice)
	}
}
