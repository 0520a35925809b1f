package demo

import (
	"time"

	"cairn/checkpoint"
	"cairn/internal/app/dashboard"
	"cairn/recovery"
	"cairn/recovery/model"
)

// restoreModel is the demo's view of the product's one restore model
// (recovery/model): the demo predicts each restore from its plan and each
// checkpoint from its figures, and calibrates from the restores it
// measures. Until a term a prediction needs is measured, the demo says
// "calibrating" rather than show a number it does not believe.
type restoreModel struct{ m *model.Model }

// newRestoreModel loads the demo's model from dir ("": in memory only):
// kept there, `cairn checkpoints ls --data-dir DIR` predicts from the same
// measurements as the dashboard.
func newRestoreModel(dir string) *restoreModel { return &restoreModel{m: model.Load(dir)} }

// predictPlan predicts the restore a plan describes.
func (r *restoreModel) predictPlan(p recovery.Plan) (time.Duration, bool) {
	pr := r.m.Predict(p.Input())
	return pr.Duration(), pr.OK
}

// predictCheckpoint predicts a checkpoint's restore from the store, with
// the same input as the dashboard of a running job and `checkpoints ls`
// (slots: the job's slot count now, which a full checkpoint's rebuild
// depends on).
func (r *restoreModel) predictCheckpoint(c dashboard.Checkpoint, slots int) (time.Duration, bool) {
	pr := r.m.Predict(recovery.StoreInput(checkpoint.Mode(c.Mode), slots, demoKeyGroups, checkpoint.Figures{
		FilesUploaded: c.FilesUploaded, FilesReused: c.FilesReused, FullStateSize: c.FullStateSize}))
	return pr.Duration(), pr.OK
}

// observeResult learns from a restore the demo ran.
func (r *restoreModel) observeResult(res *recovery.Result) {
	_, _ = r.m.ObserveRestore(recovery.ResultInput(res, 0), res.Duration, "demo")
}

// observeEntry learns from a restore the job process reported.
func (r *restoreModel) observeEntry(e dashboard.Restore) {
	res := &recovery.Result{Mode: checkpoint.Mode(e.Mode), Rescaled: e.Rescaled, FromSlots: e.FromSlots, ToSlots: e.ToSlots,
		BytesDownloaded: e.BytesDownloaded, BytesLocal: e.BytesLocal, FilesDownloaded: e.Files, Duration: e.Duration, BytesMoved: e.BytesMoved}
	if e.Source == "standby" {
		res.BytesCache, res.BytesLocal = e.BytesLocal, 0
	}
	res.Figures.FullStateSize = e.BytesLocal + e.BytesDownloaded
	r.observeResult(res)
}

// calibrated reports whether the model predicts a restore of a checkpoint
// of mode from the store: "incremental" needs the open time and the
// bandwidth, "full" also the decode rate.
func (r *restoreModel) calibrated(mode string) bool {
	in := model.Input{Mode: mode, Source: model.SourceStore, Objects: 1, BytesFetch: 1 << 20}
	if mode == model.Full {
		in.BytesRebuild = 1 << 20
	}
	return r.m.Predict(in).OK
}

// fmtPrediction is a prediction for people: the duration, or "calibrating".
func fmtPrediction(d time.Duration, ok bool) string {
	if !ok {
		return "calibrating"
	}
	return fmtDuration(d)
}

// fmtDuration rounds a duration for reading: ms below 10 s.
func fmtDuration(d time.Duration) string {
	switch {
	case d < 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	case d < 10*time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// predictLocal predicts a checkpoint's restore from the node's local copy
// (kill -9): nothing to download, the open time.
func (r *restoreModel) predictLocal(c dashboard.Checkpoint) (time.Duration, bool) {
	if c.Mode == string(checkpoint.ModeFull) {
		return 0, false // a full checkpoint keeps no local copy
	}
	pr := r.m.Predict(model.Input{Mode: c.Mode, Source: model.SourceLocal, Rescale: model.Same})
	return pr.Duration(), pr.OK
}

// predictOnlineCheckpoint predicts the time until an online restore of a
// checkpoint from the store processes.
func (r *restoreModel) predictOnlineCheckpoint(c dashboard.Checkpoint) (time.Duration, bool) {
	in := recovery.StoreInput(checkpoint.Mode(c.Mode), 0, demoKeyGroups, checkpoint.Figures{
		FilesUploaded: c.FilesUploaded, FilesReused: c.FilesReused, FullStateSize: c.FullStateSize})
	first, _, ok := r.m.Predict(in).Online()
	return time.Duration(first * float64(time.Second)), ok
}

// predictOnlineFirst predicts the time until an online restore of a plan
// processes (the plain prediction when the restore cannot be online).
func (r *restoreModel) predictOnlineFirst(p recovery.Plan) (time.Duration, bool) {
	pr := r.m.Predict(p.Input())
	if first, _, ok := pr.Online(); ok {
		return time.Duration(first * float64(time.Second)), true
	}
	return pr.Duration(), pr.OK
}
