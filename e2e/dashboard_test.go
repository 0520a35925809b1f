package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"cairn/internal/cli"
	"cairn/internal/dashboard/dashboardtest"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDemoDashboardInBrowser runs `cairn demo`, loads its dashboard in
// headless Chromium and asserts the charts hold real data points (live
// throughput, checkpoint history), and that /metrics parses and carries the
// checkpoint figures.
func TestDemoDashboardInBrowser(t *testing.T) {
	chromium := dashboardtest.RequireChromium(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Main([]string{"demo", "--duration", "12s", "--rate", "2000", "--http", addr}, &out, &errOut)
	}()
	base := "http://" + addr
	// Wait for two checkpoints.
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(base + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), "cairn_checkpoint_last_id 2") || strings.Contains(string(b), "cairn_checkpoint_last_id 3") {
				p := expfmt.NewTextParser(model.UTF8Validation)
				fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
				if err != nil {
					t.Fatalf("/metrics does not parse: %v", err)
				}
				for _, name := range []string{"cairn_records_in_total", "cairn_checkpoint_sync_duration_seconds", "cairn_checkpoint_last_uploaded_bytes", "cairn_state_size_bytes"} {
					if fams[name] == nil {
						t.Errorf("/metrics lacks %s", name)
					}
				}
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint on the demo's /metrics\n%s\n%s", out.String(), errOut.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dom, err := dashboardtest.DumpDOM(ctx, chromium, base+"/", 4*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	charts := dashboardtest.Charts(dom)
	if c := charts["checkpoint-bytes"]; c.Points < 2 {
		t.Errorf("checkpoint-bytes chart has %d points, want >= 2 (charts: %+v)", c.Points, charts)
	}
	if c := charts["throughput"]; c.Points < 1 {
		t.Errorf("throughput chart has %d points", c.Points)
	}
	if code := <-done; code != 0 {
		t.Fatalf("demo exited %d\n%s\n%s", code, out.String(), errOut.String())
	}
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "verified:") {
			return
		}
	}
	t.Fatalf("demo printed no verified summary:\n%s", out.String())
}
