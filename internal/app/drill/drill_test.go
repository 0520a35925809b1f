package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"html"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn/internal/base/procs"
	"cairn/internal/testutil/testbin"
)

func TestMain(m *testing.M) {
	// The drill's restores run in this process, as in the binary (whose
	// Main raises GOMAXPROCS: procs.Tune), so BenchmarkDrillAccuracy
	// measures what cairn drill does.
	procs.Tune()
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// runDrill runs a drill of cfg with the cairn binary, in temp directories,
// and returns its report, its report directory and the table it printed;
// it fails the test on an error.
func runDrill(t *testing.T, cfg Config) (*Report, string, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds cairn and runs a drill")
	}
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	var table, progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg.Out, cfg.WorkDir, cfg.Binary, cfg.Stdout, cfg.Progress = t.TempDir(), t.TempDir(), bin, &table, &progress
	rep, err := Run(ctx, cfg)
	t.Logf("progress:\n%s", progress.String())
	t.Logf("table:\n%s", table.String())
	if err != nil {
		t.Fatal(err)
	}
	return rep, cfg.Out, table.String()
}

// readReport reads drill.json back from a drill's report directory.
func readReport(t *testing.T, out string) Report {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "drill.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("drill.json: %v", err)
	}
	return back
}

// checkSource checks where a scenario's restore read its state: the store
// downloads something, a local or standby restore nothing.
func checkSource(t *testing.T, s Scenario) {
	t.Helper()
	switch s.Source {
	case "store":
		if s.BytesDownloaded == 0 {
			t.Errorf("scenario %s: downloaded nothing from the store", s.Name)
		}
	case "local", "standby":
		if s.BytesDownloaded != 0 || s.BytesLocal == 0 {
			t.Errorf("scenario %s: downloaded %d, read locally %d: want all local", s.Name, s.BytesDownloaded, s.BytesLocal)
		}
	}
}

// TestDrillSmall runs a whole drill at a small size with a file store: the
// job runs as a real cairn process and is killed with SIGKILL, and every
// scenario's restored state must equal the state before the kill.
func TestDrillSmall(t *testing.T) {
	rep, out, table := runDrill(t, Config{StateBytes: 8 << 20, Change: 0.05, Slots: 2, RescaleTo: 1, Chain: 3, ValueBytes: 100})

	wantScenarios := []string{"store-online-older", "store-incremental", "store-full", "store-online", "local-disk", "local-rescaled-1", "standby-rescaled-1", "rescaled-incremental-1", "rescaled-full-1", "standby"}
	var got []string
	for _, s := range rep.Scenarios {
		got = append(got, s.Name)
		if !s.StateEqual {
			t.Errorf("scenario %s: restored state %s, want %v", s.Name, s.StateDigest, rep.StateBeforeKill)
		}
		if s.RestoreSeconds <= 0 || s.Files == 0 {
			t.Errorf("scenario %s: restore %.3fs, %d files: not measured", s.Name, s.RestoreSeconds, s.Files)
		}
		if s.CheckpointP50Seconds <= 0 || s.CheckpointMaxSeconds < s.CheckpointP50Seconds {
			t.Errorf("scenario %s: checkpoint p50 %.3fs max %.3fs", s.Name, s.CheckpointP50Seconds, s.CheckpointMaxSeconds)
		}
		if s.CalibratesOpenTime == "" && s.PredictedRestoreSeconds <= 0 && s.Name != "store-online" {
			t.Errorf("scenario %s: no predicted restore time", s.Name)
		}
		checkSource(t, s)
	}
	// Every term of the restore model was calibrated by the drill, and
	// each predicted row says what it was predicted from.
	for _, term := range []string{"bandwidth", "open", "decode", "move", "remote", "online open", "decode@1", "decode@2", "move@1"} {
		if !rep.ModelTerms[term].Known() {
			t.Errorf("restore model term %s not calibrated: %+v", term, rep.ModelTerms)
		}
	}
	for _, s := range rep.Scenarios {
		if s.Name == "store-online" {
			// Online: processing could start before the state was local;
			// it calibrates nothing and is not predicted as a download.
			if s.FullyLocalSeconds < s.RestoreSeconds || s.FullyLocalSeconds == 0 || !strings.Contains(s.Note, "online: processing after") || !s.StateEqual {
				t.Errorf("scenario store-online: restore %v s, fully local %v s, note %q, state equal %v", s.RestoreSeconds, s.FullyLocalSeconds, s.Note, s.StateEqual)
			}
			if s.PredictedRestoreSeconds <= 0 || !strings.HasPrefix(s.PredictionText, "online: processing after") {
				t.Errorf("scenario store-online: predicted %v s (%q), want the model's online terms", s.PredictedRestoreSeconds, s.PredictionText)
			}
			if !strings.Contains(rep.Verdict(), "online from the store: processing after") {
				t.Errorf("the verdict lacks the online restore: %s", rep.Verdict())
			}
			continue
		}
		if s.CalibratesOpenTime == "" && !strings.Contains(s.PredictionText, " open = ") {
			t.Errorf("scenario %s: prediction %q does not name its inputs", s.Name, s.PredictionText)
		}
	}
	if !strings.Contains(rep.ErrorSummary(), "worst") {
		t.Errorf("error summary %q", rep.ErrorSummary())
	}
	if strings.Join(got, ",") != strings.Join(wantScenarios, ",") {
		t.Errorf("scenarios %v, want %v", got, wantScenarios)
	}
	if rep.StateBeforeKill.Entries != int64(8<<20/116) {
		t.Errorf("state before the kill has %d keys, want %d", rep.StateBeforeKill.Entries, 8<<20/116)
	}
	if n := len(rep.Checkpoints); n != 4 {
		t.Errorf("%d checkpoints, want 3 incremental + 1 full", n)
	}

	for _, name := range wantScenarios {
		if !strings.Contains(table, name) {
			t.Errorf("table has no row %s", name)
		}
	}
	back := readReport(t, out)
	if len(back.Scenarios) != len(rep.Scenarios) {
		t.Errorf("drill.json has %d scenarios, want %d", len(back.Scenarios), len(rep.Scenarios))
	}
	page, err := os.ReadFile(filepath.Join(out, "drill.html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range append([]string{`id="drill-data">{`, html.EscapeString(rep.Verdict())}, wantScenarios...) {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("drill.html lacks %q", want)
		}
	}
	if !strings.Contains(table, "verdict: "+rep.Verdict()) {
		t.Error("the table lacks the verdict")
	}
	for _, bad := range []string{"<script src=", "<link ", `src="http`, `href="http`, "url(http", "@import"} {
		if bytes.Contains(page, []byte(bad)) {
			t.Errorf("drill.html is not self-contained: it contains %q", bad)
		}
	}
}
