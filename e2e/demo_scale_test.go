package e2e

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cairn/internal/testutil/testbin"
)

// scaleSnapshot is the presenter's part of the demo's /api/snapshot.
type scaleSnapshot struct {
	Story struct {
		Phase string `json:"phase"`
	} `json:"story"`
	Checkpoints []struct {
		ID        uint64  `json:"id"`
		Predicted float64 `json:"predicted_restore_seconds"`
	} `json:"checkpoints"`
	Presenter struct {
		Simulates     string  `json:"simulates"`
		StateBytes    int64   `json:"state_bytes"`
		CheckpointP50 float64 `json:"checkpoint_p50_seconds"`
		StoreRestore  float64 `json:"store_restore_seconds"`
		LocalRestore  float64 `json:"local_restore_seconds"`
		Budget        string  `json:"budget"`
		Rescale       *struct {
			ToSlots   int     `json:"to_slots"`
			Predicted float64 `json:"predicted_seconds"`
			Measured  float64 `json:"measured_seconds"`
			Preview   string  `json:"preview"`
		} `json:"rescale"`
		Last *struct {
			Kind            string  `json:"kind"`
			BytesLocal      int64   `json:"bytes_local"`
			BytesDownloaded int64   `json:"bytes_downloaded"`
			Predicted       float64 `json:"predicted_seconds"`
			Restored        float64 `json:"restored_seconds"`
			FirstOutput     float64 `json:"first_output_seconds"`
			FullyLocal      float64 `json:"fully_local_seconds"`
			Online          bool    `json:"online"`
		} `json:"last_failure"`
	} `json:"presenter"`
}

func getScaleSnapshot(base string) (scaleSnapshot, error) {
	var s scaleSnapshot
	resp, err := http.Get(base + "/api/snapshot")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

func pollScale(t *testing.T, p *demoProc, base, what string, limit time.Duration, ok func(scaleSnapshot) bool) scaleSnapshot {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		s, err := getScaleSnapshot(base)
		if err == nil && ok(s) {
			return s
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("demo exited (%v) while waiting for %s\n%s", err, what, tail(p.out.String(), 6000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %s (last snapshot: %+v, err %v)\n%s", what, limit, s, err, tail(p.out.String(), 6000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkLsPrediction runs `cairn checkpoints ls --data-dir` on the demo's
// store and checks that it predicts the dashboard's restore time for the
// checkpoints both show (the demo keeps its restore model in its data
// directory).
func checkLsPrediction(t *testing.T, dir string, s scaleSnapshot) {
	t.Helper()
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "checkpoints", "ls", "--store", "file://"+filepath.Join(dir, "store"), "--job", "wordcount", "--data-dir", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("checkpoints ls: %v\n%s", err, out)
	}
	dash := map[string]float64{}
	for _, c := range s.Checkpoints {
		dash[strconv.FormatUint(c.ID, 10)] = c.Predicted
	}
	compared := 0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || dash[f[0]] <= 0 {
			continue
		}
		ls, err := parsePrediction(f[len(f)-2], f[len(f)-1])
		if err != nil {
			t.Errorf("checkpoints ls row %q: predicted restore: %v", line, err)
			continue
		}
		if math.Abs(ls-dash[f[0]]) > 0.01*dash[f[0]]+0.001 {
			t.Errorf("checkpoint %s: checkpoints ls predicts %.3fs, the dashboard %.3fs", f[0], ls, dash[f[0]])
		}
		compared++
	}
	if compared == 0 {
		t.Errorf("checkpoints ls shows no prediction for a checkpoint the dashboard predicts:\n%s", out)
	}
}

// parsePrediction reads model.Seconds's "22.16 s" or "850 ms".
func parsePrediction(num, unit string) (float64, error) {
	v, err := strconv.ParseFloat(num, 64)
	switch {
	case err != nil:
		return 0, err
	case unit == "ms":
		return v / 1000, nil
	case unit == "s":
		return v, nil
	}
	return 0, fmt.Errorf("unit %q", unit)
}

func postAction(t *testing.T, base, name string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/api/action/"+name, nil)
	req.Header.Set("X-Requested-With", "cairn")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("action %s: HTTP %d", name, resp.StatusCode)
	}
}

// TestDemoAtScale runs the workshop's lesson with the real binary, the
// embedded NATS server and a bulk-loaded state behind a simulated link, at
// a reduced size: a kill -9 restores from the local copy in milliseconds;
// losing the disk downloads the whole state, at least 10× longer, within
// ±25% of the prediction the presenter view showed before the button was
// pressed; the exactly-once check passes at the end.
// demoScale runs TestDemoAtScale: a demo with 48 MiB of state behind a slow
// link, about 90 s; .ci/run runs it.
var demoScale = flag.Bool("cairn.scale", false, "run TestDemoAtScale (the demo with its state behind a slow link, about 90 s); .ci/run runs it")

func TestDemoAtScale(t *testing.T) {
	if !*demoScale {
		t.Skip("the demo at scale: run with -cairn.scale (.ci/run does)")
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	base := "http://" + addr
	dir := t.TempDir()
	p := startDemo(t, dir, freePort(t), "--http", addr, "--state", "48MiB", "--link", "4MB/s,20ms", "--rate", "200")

	running := func(s scaleSnapshot) bool { return s.Story.Phase == "running" }
	s := pollScale(t, p, base, "a calibrated store restore", 2*time.Minute, func(s scaleSnapshot) bool {
		return running(s) && len(s.Checkpoints) >= 3 && s.Presenter.StoreRestore > 0 && s.Presenter.LocalRestore > 0
	})
	if s.Presenter.StateBytes < 48<<20 || !strings.Contains(s.Presenter.Simulates, "4MB/s") {
		t.Errorf("the presenter view says it simulates %q with %d bytes of state", s.Presenter.Simulates, s.Presenter.StateBytes)
	}

	checkLsPrediction(t, dir, s)

	postAction(t, base, "kill")
	s = pollScale(t, p, base, "the kill's restore and first output", time.Minute, func(s scaleSnapshot) bool {
		return running(s) && s.Presenter.Last != nil && s.Presenter.Last.Kind == "kill -9" && s.Presenter.Last.Restored > 0 && s.Presenter.Last.FirstOutput > 0
	})
	local, localFirst := s.Presenter.Last.Restored, s.Presenter.Last.FirstOutput
	if s.Presenter.Last.BytesDownloaded != 0 {
		t.Errorf("kill -9 downloaded %d bytes, want the local copy only", s.Presenter.Last.BytesDownloaded)
	}

	s = pollScale(t, p, base, "a prediction after the kill", time.Minute, func(s scaleSnapshot) bool {
		return running(s) && s.Presenter.StoreRestore > 0
	})
	predicted := s.Presenter.StoreRestore // what the presenter view shows before the button
	postAction(t, base, "lose-disk")
	s = pollScale(t, p, base, "the lost disk's restore", 2*time.Minute, func(s scaleSnapshot) bool {
		return s.Presenter.Last != nil && s.Presenter.Last.Kind == "lost the disk" && s.Presenter.Last.Restored > 0
	})
	f := s.Presenter.Last
	store := f.Restored
	t.Logf("local restore %.3fs; store restore %.2fs downloading %d bytes, predicted %.2fs before the button (%.2fs by the plan); budget: %s",
		local, store, f.BytesDownloaded, predicted, f.Predicted, s.Presenter.Budget)
	if f.BytesLocal != 0 || f.BytesDownloaded < 48<<20 {
		t.Errorf("losing the disk read %d bytes locally and downloaded %d, want the whole state from the store", f.BytesLocal, f.BytesDownloaded)
	}
	if store < 10*local {
		t.Errorf("the store restore took %.3fs, under 10× the local restore (%.3fs)", store, local)
	}
	if off := math.Abs(store/predicted - 1); off > 0.25 {
		t.Errorf("the store restore took %.2fs, %.0f%% off the %.2fs predicted before the button (want ±25%%)", store, off*100, predicted)
	}

	// Lose the disk again, online: processing resumes while the state
	// downloads. The first new output of any restart comes after the
	// process started and replayed the input since the checkpoint (the
	// outputs it replays were published before the failure: exactly once,
	// they are not published again), which the kill -9 above paid too; the
	// online restore's own share is the rest, its reads of state not yet
	// local. It must come well before a download restore would even have
	// ended, and the state is fully local later.
	// Pressed once the restarted process has committed a checkpoint of its
	// own, as the workshop's guide says: before that the online restart
	// would restore the checkpoint from before the kill -9 (whose restart
	// reads the reused objects back before its first checkpoint) and
	// replay everything since, which is the kill's, not the online
	// restore's.
	newest := func(s scaleSnapshot) uint64 {
		var id uint64
		for _, c := range s.Checkpoints {
			id = max(id, c.ID)
		}
		return id
	}
	before := newest(s)
	pollScale(t, p, base, "a checkpoint after the lost disk", 2*time.Minute, func(s scaleSnapshot) bool {
		return running(s) && newest(s) > before
	})
	postAction(t, base, "lose-disk-online")
	s = pollScale(t, p, base, "the online restore's first output and its fully local state", 4*time.Minute, func(s scaleSnapshot) bool {
		l := s.Presenter.Last
		return l != nil && l.Online && l.FirstOutput > 0 && l.FullyLocal > 0
	})
	f = s.Presenter.Last
	t.Logf("online restore: first output %.3fs after the restart (kill -9: %.3fs), fully local after %.2fs (a download restore: %.2fs)", f.FirstOutput, localFirst, f.FullyLocal, store)
	if f.FirstOutput >= store/2 {
		t.Errorf("the online restore's first output came %.3fs after the restart, not within half of a download restore (%.2fs)", f.FirstOutput, store)
	}
	if f.FullyLocal <= f.FirstOutput {
		t.Errorf("the online restore was fully local after %.3fs, before its first output (%.3fs): nothing was downloaded in the background", f.FullyLocal, f.FirstOutput)
	}

	// Rescale 2 → 3: the preview predicts it (the move term, calibrated
	// by the demo with a local rescale) before it runs, then it is measured.
	// At this size the move is a few MiB and the time mostly opening three
	// DBs on a loaded machine: the two are logged, not compared.
	pollScale(t, p, base, "running after the online restore", 2*time.Minute, func(s scaleSnapshot) bool {
		return running(s) && len(s.Checkpoints) > 0
	})
	postAction(t, base, "rescale-preview?slots=3")
	s = pollScale(t, p, base, "the rescale preview", time.Minute, func(s scaleSnapshot) bool {
		return s.Presenter.Rescale != nil && s.Presenter.Rescale.ToSlots == 3
	})
	preview := s.Presenter.Rescale.Predicted
	postAction(t, base, "rescale?slots=3")
	s = pollScale(t, p, base, "the rescale's measured restore", 2*time.Minute, func(s scaleSnapshot) bool {
		return running(s) && s.Presenter.Rescale != nil && s.Presenter.Rescale.Measured > 0
	})
	rs := s.Presenter.Rescale
	t.Logf("rescale 2 → 3: preview %.3fs, predicted %.3fs when it ran, measured %.3fs", preview, rs.Predicted, rs.Measured)
	if preview <= 0 {
		t.Errorf("the rescale preview predicted nothing (calibrating): %s", rs.Preview)
	}

	_ = p.cmd.Process.Signal(os.Interrupt) // stop: drain, stop the job, check the outputs
	p.wait(t)
	t.Logf("%s", lastLines(p.out.String(), 3))
}
