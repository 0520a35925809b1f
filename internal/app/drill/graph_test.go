package drill

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDrillGraph drills a job graph of two sub-topologies at a small size:
// the job runs as a real cairn process on a real embedded NATS and is killed
// with SIGKILL, and every scenario of each sub-topology's chain (its own
// checkpoints, restored into its own state) must have run and restored the
// state that sub-topology held before the kill.
func TestDrillGraph(t *testing.T) {
	const state, valueBytes, change, chain = 2 << 20, 100, 0.05, 3
	rep, out, table := runDrill(t, Config{StateBytes: state, Change: change, Slots: 2, RescaleTo: 1, Chain: chain, ValueBytes: valueBytes, Graph: true})

	// The state of each sub-topology: s0 one key per generated key; s1 one
	// per input message (every key's every count), so keyed otherwise.
	keys := state / (valueBytes + 16)
	changed := int(float64(keys) * change)
	wantKeys := map[string]int{"s0": keys, "s1": keys + (chain-1)*changed}
	if len(rep.SubTopologies) != 2 {
		t.Fatalf("%d sub-topologies in the report, want 2: %+v", len(rep.SubTopologies), rep.SubTopologies)
	}
	for i, st := range rep.SubTopologies {
		wantJob := "drill"
		if i == 1 {
			wantJob = "drill.s1"
		}
		if st.Job != wantJob || st.Keys != wantKeys[st.Name] || st.StateBeforeKill.Entries != int64(wantKeys[st.Name]) {
			t.Errorf("sub-topology %d: %s (chain %s), %d keys, state %v; want chain %s, %d keys", i, st.Name, st.Job, st.Keys, st.StateBeforeKill, wantJob, wantKeys[st.Name])
		}
		if st.JobStateBytes <= 0 {
			t.Errorf("sub-topology %s: no state measured at the kill", st.Name)
		}
		for _, term := range []string{"bandwidth", "open", "decode", "move", "remote", "online open"} {
			if !st.ModelTerms[term].Known() {
				t.Errorf("sub-topology %s: restore model term %s not calibrated: %+v", st.Name, term, st.ModelTerms)
			}
		}
	}
	if rep.SubTopologies[0].StateBeforeKill == rep.SubTopologies[1].StateBeforeKill {
		t.Error("both sub-topologies have the same state: the second is not keyed otherwise")
	}

	base := []string{"store-online-older", "store-incremental", "store-full", "store-online", "local-disk", "local-rescaled-1", "standby-rescaled-1", "rescaled-incremental-1", "rescaled-full-1", "standby"}
	var want, got []string
	for _, sub := range []string{"s0", "s1"} {
		for _, n := range base {
			want = append(want, sub+" "+n)
		}
	}
	for _, s := range rep.Scenarios {
		got = append(got, s.Name)
		sub, _, _ := strings.Cut(s.Name, " ")
		if s.SubTopology != sub {
			t.Errorf("scenario %s: sub-topology %q", s.Name, s.SubTopology)
		}
		// Verified against its own sub-topology's state before the kill.
		var wantDigest digest
		for _, st := range rep.SubTopologies {
			if st.Name == s.SubTopology {
				wantDigest = st.StateBeforeKill
			}
		}
		if !s.StateEqual || (!strings.HasSuffix(s.Name, "store-online-older") && s.StateDigest != wantDigest.String()) {
			t.Errorf("scenario %s: restored state %s (equal %v), want %v", s.Name, s.StateDigest, s.StateEqual, wantDigest)
		}
		if s.RestoreSeconds <= 0 || s.Files == 0 {
			t.Errorf("scenario %s: restore %.3fs, %d files: not measured", s.Name, s.RestoreSeconds, s.Files)
		}
		if s.CheckpointP50Seconds <= 0 || s.BytesUploaded <= 0 {
			t.Errorf("scenario %s: checkpoint p50 %.3fs, uploaded %d: the checkpoint figures are not its sub-topology's", s.Name, s.CheckpointP50Seconds, s.BytesUploaded)
		}
		if s.CalibratesOpenTime == "" && s.PredictedRestoreSeconds <= 0 {
			t.Errorf("scenario %s: no predicted restore time (%q)", s.Name, s.PredictionText)
		}
		checkSource(t, s)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("scenarios\n%v\nwant\n%v", got, want)
	}
	// Each chain: chain incremental checkpoints and one full.
	for _, sub := range []string{"s0", "s1"} {
		var modes []string
		for _, c := range rep.Checkpoints {
			if c.SubTopology == sub {
				modes = append(modes, c.Mode)
			}
		}
		if !slices.Equal(modes, []string{"incremental", "incremental", "incremental", "full"}) {
			t.Errorf("sub-topology %s: checkpoints %v, want 3 incremental and a full", sub, modes)
		}
	}

	v := rep.Verdict()
	if !strings.HasPrefix(v, "s0: incremental vs full") || !strings.Contains(v, "; s1: incremental vs full") {
		t.Errorf("verdict %q: want one per sub-topology", v)
	}
	for _, name := range append(want, "verdict: "+v, "s1 (chain drill.s1)") {
		if !strings.Contains(table, name) {
			t.Errorf("table lacks %q", name)
		}
	}
	back := readReport(t, out)
	if len(back.Scenarios) != len(want) || len(back.SubTopologies) != 2 || back.SubTopologies[1].StateBeforeKill != rep.SubTopologies[1].StateBeforeKill ||
		back.Scenarios[len(want)-1].SubTopology != "s1" || back.Config.Graph == "" {
		t.Errorf("drill.json does not hold the graph's report: %d scenarios, sub-topologies %+v, graph %q", len(back.Scenarios), back.SubTopologies, back.Config.Graph)
	}
	page, err := os.ReadFile(filepath.Join(out, "drill.html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range append([]string{`data-checkpoint="s1 4"`, "chain drill.s1"}, want...) {
		if !bytes.Contains(page, []byte(w)) {
			t.Errorf("drill.html lacks %q", w)
		}
	}
}
