package drill

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"cairn/internal/app/dashboard"
)

// Report is everything a drill measured; drill.json is its JSON. Field
// names ending in _seconds are durations and those with bytes are byte
// counts (the dashboard formats them by name).
type Report struct {
	Started time.Time    `json:"started"`
	Config  ReportConfig `json:"config"`
	// StateBeforeKill is the digest of the job's user state when it was
	// killed; every scenario's restored state must equal it.
	StateBeforeKill digest `json:"state_before_kill"`
	// JobStateBytes is the job's local state size (Pebble's estimate) at
	// the kill.
	JobStateBytes int64 `json:"job_state_bytes"`
	// JobStateBytesPerSlot is the same per slot.
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
	OpenSeconds map[string]float64  `json:"open_seconds"`
	Scenarios   []Scenario          `json:"scenarios"`
	Checkpoints []CheckpointFigures `json:"checkpoints"`

	taken []checkpointTaken
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
}

// Scenario is one restore and the checkpoint figures beside it.
type Scenario struct {
	Name         string `json:"name"`
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
	BytesUploaded           int64   `json:"bytes_uploaded"`
	RestoreSeconds          float64 `json:"restore_seconds"`
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
	// CalibratesOpenTime names the mode whose open time this scenario
	// measured (its prediction equals its measurement by construction).
	CalibratesOpenTime string `json:"calibrates_open_time,omitempty"`
	Note               string `json:"note,omitempty"`
}

// CheckpointFigures is one checkpoint the drill took.
type CheckpointFigures struct {
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

// Table prints one row per scenario.
func (r *Report) Table(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "\ncairn drill: %d keys × %d B (state %s on disk), %d slots, key_groups %d, chain %d, change %.2f%%, store %s\n",
		c.Keys, c.ValueBytes, fmtBytes(r.JobStateBytes), c.Slots, c.KeyGroups, c.Chain, c.Change*100, c.Store)
	limit := "unthrottled"
	if c.BandwidthBytesPerSec > 0 {
		limit = fmt.Sprintf("limited to %s/s on %s", fmtBytes(c.BandwidthBytesPerSec), c.Throttled)
	}
	fmt.Fprintf(w, "bandwidth: %s; measured download %s/s (standby sync), upload %s/s; open time: incremental %s, full %s\n\n",
		limit, fmtBytes(r.MeasuredBandwidth), fmtBytes(r.UploadBandwidth), fmtSec(r.OpenSeconds["incremental"]), fmtSec(r.OpenSeconds["full"]))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tchk\tmode\tchain\tslots\tchk p50\tchk max\tuploaded\trestore\tpredicted\tΔ\tdownloaded\tlocal\tfiles\tretained excl\tretained shared\tstate\t")
	for _, s := range r.Scenarios {
		slots := fmt.Sprint(s.ToSlots)
		if s.Rescaled {
			slots = fmt.Sprintf("%d→%d", s.FromSlots, s.ToSlots)
		}
		delta := fmt.Sprintf("%+.0f%%", s.PredictionError*100)
		if s.CalibratesOpenTime != "" {
			delta = "(calib)"
		} else if s.PredictedRestoreSeconds == 0 {
			delta = "—"
		}
		ok := "equal"
		if !s.StateEqual {
			ok = "DIFFERS"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t\n",
			s.Name, s.CheckpointID, s.Mode, s.ChainLength, slots, fmtSec(s.CheckpointP50Seconds), fmtSec(s.CheckpointMaxSeconds),
			fmtBytes(s.BytesUploaded), fmtSec(s.RestoreSeconds), fmtSec(s.PredictedRestoreSeconds), delta,
			fmtBytes(s.BytesDownloaded), fmtBytes(s.BytesLocal), s.Files, fmtBytes(s.RetainedExclusiveBytes), fmtBytes(s.RetainedSharedBytes), ok)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\npredicted = bytes to fetch ÷ measured download bandwidth + open time of the mode (measured by the (calib) rows, which fetch nothing).")
	fmt.Fprintln(w, "Checkpoint duration is not restore time: compare the chk and restore columns.")
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

// HTML renders the report as the dashboard's self-contained page: the
// checkpoint history charts, the restores beside the checkpoint durations,
// and the scenario table.
func (r *Report) HTML() ([]byte, error) {
	js, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	s := dashboard.Snapshot{Job: jobName + " (drill)", Slots: r.Config.Slots, KeyGroups: r.Config.KeyGroups, StateBytes: r.JobStateBytesPerSlot, Drill: js}
	for _, c := range r.Checkpoints {
		s.Checkpoints = append(s.Checkpoints, dashboard.Checkpoint{
			ID: c.ID, Mode: c.Mode, Time: c.Time,
			SyncDuration: secs(c.SyncSeconds), AsyncDuration: secs(c.AsyncSeconds),
			BytesUploaded: c.BytesUploaded, FullStateSize: c.FullStateBytes,
			FilesUploaded: c.FilesUploaded, FilesReused: c.FilesReused, ChainLength: c.ChainLength,
			RetainedExclusive: c.RetainedExclusiveBytes, RetainedShared: c.RetainedSharedBytes,
			PredictedRestore: secs(r.predictFromStore(c)),
		})
	}
	for _, sc := range r.Scenarios {
		s.Restores = append(s.Restores, dashboard.Restore{
			CheckpointID: sc.CheckpointID, Mode: sc.Mode, Time: r.Started, Duration: secs(sc.RestoreSeconds),
			BytesLocal: sc.BytesLocal, BytesDownloaded: sc.BytesDownloaded, Files: sc.Files,
			Rescaled: sc.Rescaled, FromSlots: sc.FromSlots, ToSlots: sc.ToSlots, ChainLength: sc.ChainLength,
			Source: sc.Source,
		})
	}
	return dashboard.RenderStatic(s, time.Now())
}

// predictFromStore is a checkpoint's predicted restore time from the store
// at the drill's slot count.
func (r *Report) predictFromStore(c CheckpointFigures) float64 {
	if r.MeasuredBandwidth <= 0 {
		return 0
	}
	return float64(c.FullStateBytes)/float64(r.MeasuredBandwidth) + r.OpenSeconds[c.Mode]
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
