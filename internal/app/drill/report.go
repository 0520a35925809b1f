package drill

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"cairn/checkpoint"
	"cairn/recovery"
	rmodel "cairn/recovery/model"
)

// Report is everything a drill measured; drill.json is its JSON. Field
// names ending in _seconds are durations and those with bytes are byte
// counts (the dashboard formats them by name).
type Report struct {
	Started time.Time    `json:"started"`
	Config  ReportConfig `json:"config"`
	// StateBeforeKill is the digest of the job's user state when it was
	// killed; every scenario's restored state must equal it (a graph's:
	// the first sub-topology's; each one's is in SubTopologies).
	StateBeforeKill digest `json:"state_before_kill"`
	// JobStateBytes is the job's local state size (Pebble's estimate) at
	// the kill (a graph's: every sub-topology's).
	JobStateBytes int64 `json:"job_state_bytes"`
	// JobStateBytesPerSlot is the same per slot (a graph's: the first
	// sub-topology's).
	JobStateBytesPerSlot []uint64 `json:"job_state_bytes_per_slot"`
	// MeasuredBandwidth is the download rate measured during the drill
	// (the standby following the checkpoints), in bytes/s: the bandwidth of
	// the predictions.
	MeasuredBandwidth int64 `json:"measured_download_bytes_per_second"`
	// UploadBandwidth is bytes uploaded ÷ async checkpoint time.
	UploadBandwidth int64 `json:"measured_upload_bytes_per_second"`
	// StandbyLagBytes is what the standby still lacked at the kill.
	StandbyLagBytes int64 `json:"standby_lag_bytes"`
	// OpenSeconds is the measured open time per mode: a restore's time
	// without its download (from the scenarios that fetch nothing).
	OpenSeconds map[string]float64 `json:"open_seconds"`
	// ModelTerms are the restore model's terms at the end of the drill
	// (recovery/model): what every prediction was made from (a graph's:
	// the first sub-topology's model; each has its own).
	ModelTerms  map[string]rmodel.Term `json:"model_terms"`
	Scenarios   []Scenario             `json:"scenarios"`
	Checkpoints []CheckpointFigures    `json:"checkpoints"`
	// SubTopologies is, for a job graph (Config.Graph), each
	// sub-topology's chain: its state and its own measurements.
	SubTopologies []SubTopologyReport `json:"sub_topologies,omitempty"`

	// model is the restore model the scenarios calibrate and predict with
	// (a graph's first sub-topology's); models each chain's, by
	// sub-topology ("" for the one chain).
	model  *rmodel.Model
	models map[string]*rmodel.Model
}

// SubTopologyReport is one sub-topology of a drilled job graph: its
// checkpoint chain (Job in the store), its state at the kill and what its
// restores measured. Its scenarios and checkpoints are those whose
// sub_topology is Name.
type SubTopologyReport struct {
	Name string `json:"name"`
	Job  string `json:"job"`
	// Keys is the number of keys of its state at the kill.
	Keys              int                    `json:"keys"`
	StateBeforeKill   digest                 `json:"state_before_kill"`
	JobStateBytes     int64                  `json:"job_state_bytes"`
	MeasuredBandwidth int64                  `json:"measured_download_bytes_per_second"`
	UploadBandwidth   int64                  `json:"measured_upload_bytes_per_second"`
	StandbyLagBytes   int64                  `json:"standby_lag_bytes"`
	OpenSeconds       map[string]float64     `json:"open_seconds"`
	ModelTerms        map[string]rmodel.Term `json:"model_terms"`
}

// ReportConfig is the drill's configuration as run.
type ReportConfig struct {
	StateBytes           int64   `json:"state_target_bytes"`
	Keys                 int     `json:"keys"`
	ValueBytes           int     `json:"state_bytes_per_key"`
	Change               float64 `json:"change_fraction"`
	Slots                int     `json:"slots"`
	RescaleTo            int     `json:"rescale_to"`
	KeyGroups            int     `json:"key_groups"`
	Store                string  `json:"store"`
	BandwidthBytesPerSec int64   `json:"bandwidth_limit_bytes_per_second"`
	Throttled            string  `json:"throttled"`
	Chain                int     `json:"chain"`
	// Repeat is the restores per scenario.
	Repeat int `json:"repeat,omitempty"`
	// Graph describes the job graph drilled ("": the one-chain count).
	Graph string `json:"graph,omitempty"`
}

// Scenario is one restore and the checkpoint figures beside it.
type Scenario struct {
	Name string `json:"name"`
	// SubTopology is the sub-topology whose chain a graph's scenario
	// restored ("s0", "s1"; "" for the one-chain job).
	SubTopology  string `json:"sub_topology,omitempty"`
	Source       string `json:"source"`
	CheckpointID uint64 `json:"checkpoint_id"`
	Mode         string `json:"mode"`
	ChainLength  int    `json:"chain_length"`
	FromSlots    int    `json:"from_slots"`
	ToSlots      int    `json:"to_slots"`
	Rescaled     bool   `json:"rescaled"`
	// Checkpoint duration (barrier to commit) over the drill's checkpoints
	// of this mode.
	CheckpointP50Seconds float64 `json:"checkpoint_p50_seconds"`
	CheckpointMaxSeconds float64 `json:"checkpoint_max_seconds"`
	CheckpointsMeasured  int     `json:"checkpoints_measured"`
	// BytesUploaded is what the restored checkpoint uploaded.
	BytesUploaded int64 `json:"bytes_uploaded"`
	// RestoreSeconds is the restore's time: with Config.Repeat, the
	// median of Restores restores, which took from RestoreMinSeconds to
	// RestoreMaxSeconds.
	RestoreSeconds          float64 `json:"restore_seconds"`
	Restores                int     `json:"restores,omitempty"`
	RestoreMinSeconds       float64 `json:"restore_min_seconds,omitempty"`
	RestoreMaxSeconds       float64 `json:"restore_max_seconds,omitempty"`
	PredictedRestoreSeconds float64 `json:"predicted_restore_seconds"`
	// PredictionError is (measured - predicted) / predicted.
	PredictionError float64 `json:"prediction_error"`
	// BytesToFetch is what the prediction expected to download.
	BytesToFetch           int64  `json:"bytes_to_fetch"`
	BytesDownloaded        int64  `json:"bytes_downloaded"`
	BytesLocal             int64  `json:"bytes_read_locally"`
	Files                  int    `json:"files"`
	RetainedExclusiveBytes int64  `json:"retained_exclusive_bytes"`
	RetainedSharedBytes    int64  `json:"retained_shared_bytes"`
	StateEqual             bool   `json:"state_equal"`
	StateDigest            string `json:"state_digest"`
	// CalibratesOpenTime names the restore model's term this scenario
	// measured (open, decode, move): it had no prediction before.
	CalibratesOpenTime string `json:"calibrates_open_time,omitempty"`
	// PredictionText is the prediction with its inputs, or why there is
	// none ("calibrating (...)").
	PredictionText string `json:"prediction,omitempty"`
	Note           string `json:"note,omitempty"`
	// FullyLocalSeconds is, for an online restore (RestoreSeconds is then
	// the time until the DBs could be read), the time until every file
	// was local and verified.
	FullyLocalSeconds float64 `json:"fully_local_seconds,omitempty"`
}

// CheckpointFigures is one checkpoint the drill took.
type CheckpointFigures struct {
	// SubTopology is a graph's sub-topology the checkpoint is of.
	SubTopology string    `json:"sub_topology,omitempty"`
	ID          uint64    `json:"id"`
	Mode        string    `json:"mode"`
	ChainLength int       `json:"chain_length"`
	Time        time.Time `json:"time"`
	SourceSeq   uint64    `json:"source_seq"`
	// DurationSeconds is the engine's, barrier to manifest commit.
	DurationSeconds        float64 `json:"duration_seconds"`
	SyncSeconds            float64 `json:"sync_seconds"`
	AsyncSeconds           float64 `json:"async_seconds"`
	BytesUploaded          int64   `json:"bytes_uploaded"`
	FilesUploaded          int     `json:"files_uploaded"`
	FilesReused            int     `json:"files_reused"`
	FullStateBytes         int64   `json:"full_state_bytes"`
	RetainedExclusiveBytes int64   `json:"retained_exclusive_bytes"`
	RetainedSharedBytes    int64   `json:"retained_shared_bytes"`
}

// write prints the table and writes drill.json and drill.html into dir.
func (r *Report) write(dir string, w io.Writer) error {
	r.Table(w)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "drill.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	page, err := r.HTML()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "drill.html"), page, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nwrote %s and %s\n", filepath.Join(dir, "drill.json"), filepath.Join(dir, "drill.html"))
	return nil
}

// Table prints one row per scenario, and the verdict.
func (r *Report) Table(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "\ncairn drill: %d keys × %d B (state %s on disk), %d slots, key_groups %d, chain %d, change %.2f%%, store %s\n",
		c.Keys, c.ValueBytes, fmtBytes(r.JobStateBytes), c.Slots, c.KeyGroups, c.Chain, c.Change*100, c.Store)
	if len(r.SubTopologies) > 0 {
		fmt.Fprintf(w, "bandwidth: %s; measured download %s/s (standby sync), upload %s/s\njob graph: %s\n",
			r.limitText(), fmtBytes(r.MeasuredBandwidth), fmtBytes(r.UploadBandwidth), c.Graph)
		for _, s := range r.SubTopologies {
			fmt.Fprintf(w, "%s (chain %s): %d keys, state %s on disk; restore model: %s\n", s.Name, s.Job, s.Keys, fmtBytes(s.JobStateBytes), termsText(s.ModelTerms))
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "bandwidth: %s; measured download %s/s (standby sync), upload %s/s\nrestore model: %s\n\n",
			r.limitText(), fmtBytes(r.MeasuredBandwidth), fmtBytes(r.UploadBandwidth), r.termsText())
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tchk\tmode\tchain\tslots\tchk p50\tchk max\tuploaded\trestore\tpredicted\tΔ\tdownloaded\tlocal\tfiles\tretained excl\tretained shared\tstate\t")
	for _, s := range r.Scenarios {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t\n",
			s.Name, s.CheckpointID, s.Mode, s.ChainLength, slotsText(s), fmtSec(s.CheckpointP50Seconds), fmtSec(s.CheckpointMaxSeconds),
			fmtBytes(s.BytesUploaded), restoreText(s), predictedText(s), deltaText(s),
			fmtBytes(s.BytesDownloaded), fmtBytes(s.BytesLocal), s.Files, fmtBytes(s.RetainedExclusiveBytes), fmtBytes(s.RetainedSharedBytes), stateText(s))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nverdict: %s\n", r.Verdict())
	fmt.Fprintf(w, "prediction error: %s\n", r.ErrorSummary())
	fmt.Fprintln(w, "\npredicted = bytes to fetch ÷ measured bandwidth + (per-object latency × objects downloaded whole + per-request latency × ranged reads) ÷ parallelism")
	fmt.Fprintln(w, "+ rebuild (full: decode per GiB; scale-down: key groups moved per GiB, at the slots rebuilding at once) + open time; a full checkpoint decodes as it fetches:")
	fmt.Fprintln(w, "max(fetch, rebuild) + open; online: online open + metadata files × per-object latency ÷ parallelism + remote SSTs × placing;")
	fmt.Fprintln(w, "each (calib) row measured one term (open, move, decode, online open and per remote file) the later rows use, and every restore recalibrates the model.")
	fmt.Fprintln(w, "Checkpoint duration is not restore time: compare the chk and restore columns.")
}

// The cells the table and the HTML report share: both show a scenario's
// figures through these, so they cannot disagree.

func slotsText(s Scenario) string {
	if s.Rescaled {
		return fmt.Sprintf("%d→%d", s.FromSlots, s.ToSlots)
	}
	return fmt.Sprint(s.ToSlots)
}

// restoreText is the scenario's measured restore time: with repeats, the
// median and the range ("113ms (98ms–130ms)").
func restoreText(s Scenario) string {
	if s.Restores > 1 {
		return fmt.Sprintf("%s (%s–%s)", fmtSec(s.RestoreSeconds), fmtSec(s.RestoreMinSeconds), fmtSec(s.RestoreMaxSeconds))
	}
	return fmtSec(s.RestoreSeconds)
}

// predictedText is the scenario's predicted restore time ("—": none).
func predictedText(s Scenario) string {
	if s.PredictedRestoreSeconds <= 0 {
		return "—"
	}
	return fmtSec(s.PredictedRestoreSeconds)
}

// deltaText is (measured - predicted) / predicted, signed, in percent;
// "(calib)" for a scenario that measured an open time (its prediction is
// its measurement by construction).
func deltaText(s Scenario) string {
	switch {
	case s.CalibratesOpenTime != "":
		return "(calib)"
	case s.PredictedRestoreSeconds <= 0:
		return "—"
	}
	return fmt.Sprintf("%+.0f%%", s.PredictionError*100)
}

func stateText(s Scenario) string {
	if s.StateEqual {
		return "equal"
	}
	return "DIFFERS"
}

// limitText is the drill's bandwidth limit.
func (r *Report) limitText() string {
	if c := r.Config; c.BandwidthBytesPerSec > 0 {
		return fmt.Sprintf("limited to %s/s on %s", fmtBytes(c.BandwidthBytesPerSec), c.Throttled)
	}
	return "unthrottled"
}

// predictStore is a checkpoint's predicted restore from the store onto its
// own slots: the same model and input as the dashboard and `cairn
// checkpoints ls|show` (0, false while calibrating).
func (r *Report) predictStore(c CheckpointFigures) rmodel.Prediction {
	m := r.models[c.SubTopology]
	if m == nil {
		m = r.model
	}
	if m == nil {
		return rmodel.New().Predict(rmodel.Input{})
	}
	return m.Predict(recovery.StoreInput(checkpoint.Mode(c.Mode), r.Config.Slots, r.Config.KeyGroups, checkpoint.Figures{
		FilesUploaded: c.FilesUploaded, FilesReused: c.FilesReused, FullStateSize: c.FullStateBytes}))
}

// termsText is the model's terms, for the table's header.
func (r *Report) termsText() string { return termsText(r.ModelTerms) }

// termsText is a restore model's terms.
func termsText(t map[string]rmodel.Term) string {
	val := func(name string, f func(float64) string) string {
		if !t[name].Known() {
			return "calibrating"
		}
		return f(t[name].Value)
	}
	perGiB := func(v float64) string { return fmtSec(v) + "/GiB" }
	// The rebuild rates as measured, by workers (decode@1, decode@2).
	rates := func(term string) string {
		var parts []string
		for w := 1; w <= 64; w++ {
			if k := rmodel.RebuildKey(term, w); t[k].Known() {
				parts = append(parts, fmt.Sprintf("%s at %d", perGiB(t[k].Value), w))
			}
		}
		if len(parts) == 0 {
			return val(term, perGiB) + " per worker"
		}
		return strings.Join(parts, ", ")
	}
	return fmt.Sprintf("bandwidth %s, latency %s/object, %s/ranged read, open %s, decode %s, move %s, online open %s + %s/remote file",
		val(rmodel.TermBandwidth, func(v float64) string { return fmtBytes(int64(v)) + "/s" }),
		val(rmodel.TermLatency, fmtSec), val(rmodel.TermRequest, fmtSec), val(rmodel.TermOpen, fmtSec), rates(rmodel.TermDecode), rates(rmodel.TermMove), val(rmodel.TermOnlineOpen, fmtSec), val(rmodel.TermRemote, fmtSec))
}

// ErrorSummary is every predicted scenario's error, (measured - predicted)
// ÷ predicted, and the worst, against the goal of ±25%.
func (r *Report) ErrorSummary() string {
	var parts []string
	worst := -1.0
	for _, s := range r.Scenarios {
		if s.CalibratesOpenTime != "" || s.PredictedRestoreSeconds <= 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %+.0f%%", s.Name, s.PredictionError*100))
		worst = max(worst, math.Abs(s.PredictionError))
	}
	if worst < 0 {
		return "no scenario was predicted"
	}
	verdict := "within"
	if worst > 0.25 {
		verdict = "OUTSIDE"
	}
	return fmt.Sprintf("%s; worst %.0f%%, %s the ±25%% goal", strings.Join(parts, ", "), worst*100, verdict)
}

// Verdict is the report's one line, from the measured rows: the incremental
// and the full checkpoint compared by their time to take (p50 of the
// drill's checkpoints of each mode), the bytes each uploaded, and their
// restore time from the store at the job's slot count, at the drill's
// bandwidth; then the local-disk restore. A scenario whose restored state
// differs comes first.
func (r *Report) Verdict() string {
	if len(r.SubTopologies) == 0 {
		return r.verdict(r.Scenarios)
	}
	// A graph: the verdict of each sub-topology's rows.
	var parts []string
	for _, st := range r.SubTopologies {
		var rows []Scenario
		for _, s := range r.Scenarios {
			if s.SubTopology == st.Name {
				rows = append(rows, s)
			}
		}
		parts = append(parts, st.Name+": "+r.verdict(rows))
	}
	return strings.Join(parts, "; ")
}

// verdict is the verdict of a chain's rows.
func (r *Report) verdict(scenarios []Scenario) string {
	var bad []string
	var inc, full, local, online *Scenario
	for i := range scenarios {
		s := &scenarios[i]
		if !s.StateEqual {
			bad = append(bad, s.Name)
		}
		switch {
		case s.FullyLocalSeconds > 0:
			online = s
		case s.Source == "store" && !s.Rescaled && s.Mode == "incremental" && inc == nil:
			inc = s
		case s.Source == "store" && !s.Rescaled && s.Mode == "full" && full == nil:
			full = s
		case s.Source == "local" && local == nil:
			local = s
		}
	}
	var b strings.Builder
	if len(bad) > 0 {
		fmt.Fprintf(&b, "RESTORED STATE DIFFERS in %s; ", strings.Join(bad, ", "))
	}
	if inc == nil || full == nil {
		fmt.Fprintf(&b, "%d restores", len(scenarios))
		if len(bad) == 0 && len(scenarios) > 0 {
			b.WriteString(", restored state equal in all")
		}
		for i, s := range scenarios {
			sep := ": "
			if i > 0 {
				sep = ", "
			}
			fmt.Fprintf(&b, "%s%s %s", sep, s.Name, fmtSec(s.RestoreSeconds))
		}
		return b.String()
	}
	fmt.Fprintf(&b, "incremental vs full, restored from the store at %s: %s (p50 %s vs %s; %s vs %s uploaded), %s (%s vs %s)",
		r.bandwidthText(),
		compare(inc.CheckpointP50Seconds, full.CheckpointP50Seconds, "to take"),
		fmtSec(inc.CheckpointP50Seconds), fmtSec(full.CheckpointP50Seconds), fmtBytes(inc.BytesUploaded), fmtBytes(full.BytesUploaded),
		compare(inc.RestoreSeconds, full.RestoreSeconds, "to restore"),
		fmtSec(inc.RestoreSeconds), fmtSec(full.RestoreSeconds))
	if local != nil {
		fmt.Fprintf(&b, "; from the local disk %s", fmtSec(local.RestoreSeconds))
	}
	if online != nil {
		fmt.Fprintf(&b, "; online from the store: processing after %s, fully local after %s", fmtSec(online.RestoreSeconds), fmtSec(online.FullyLocalSeconds))
	}
	return b.String()
}

// bandwidthText is the bandwidth the store restores ran at: the drill's
// limit, else the measured download rate.
func (r *Report) bandwidthText() string {
	switch {
	case r.Config.BandwidthBytesPerSec > 0:
		return fmtBytes(r.Config.BandwidthBytesPerSec) + "/s (the drill's limit)"
	case r.MeasuredBandwidth > 0:
		return fmtBytes(r.MeasuredBandwidth) + "/s (measured, unthrottled)"
	}
	return "an unmeasured bandwidth"
}

// compare says how the incremental time a compares to the full time b
// (lower is better): "2.1× faster to take".
func compare(a, b float64, what string) string {
	switch {
	case a <= 0 || b <= 0:
		return "not measured " + what
	case b >= 1.1*a:
		return ratio(b/a) + " faster " + what
	case a >= 1.1*b:
		return ratio(a/b) + " slower " + what
	}
	return "about as fast " + what
}

func ratio(x float64) string {
	if x >= 10 {
		return fmt.Sprintf("%.0f×", x)
	}
	return fmt.Sprintf("%.1f×", x)
}

func fmtSec(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s < 1:
		return fmt.Sprintf("%.0fms", s*1000)
	case s < 100:
		return fmt.Sprintf("%.2fs", s)
	}
	return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
}
