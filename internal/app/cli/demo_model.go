package cli

import (
	"sync"
	"time"
)

// restoreModel predicts a restore's duration from measurements only: a fixed
// cost per kind of restore (opening and validating the DBs; for full and
// rescaled restores, rebuilding them) plus the bytes to download at the
// measured download rate. Until a kind has been measured, and for downloads
// until the rate has, it has no prediction: the demo says "calibrating"
// rather than show a number it does not believe.
type restoreModel struct {
	mu struct {
		sync.Mutex
		// open is the measured fixed cost by kind (restoreKind).
		open map[string]time.Duration
		// bw is the measured download rate in bytes/s (0: not yet).
		bw float64
	}
}

// minCalibrationBytes is the smallest download that measures the rate: below
// it, fixed costs dominate.
const minCalibrationBytes = 256 << 10

func newRestoreModel() *restoreModel {
	m := &restoreModel{}
	m.mu.open = map[string]time.Duration{}
	return m
}

// restoreKind names what a restore does: "incremental" or "full", and
// "rescaled" when the slot count changes.
func restoreKind(mode string, rescaled bool) string {
	if rescaled {
		return mode + " rescaled"
	}
	return mode
}

// observe learns from a measured restore of kind that downloaded bytes.
func (m *restoreModel) observe(kind string, downloaded int64, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if downloaded == 0 {
		m.mu.open[kind] = d
		return
	}
	open, known := m.mu.open[kind]
	if known && downloaded >= minCalibrationBytes && d > open {
		m.mu.bw = float64(downloaded) / (d - open).Seconds()
		return
	}
	if m.mu.bw > 0 {
		m.mu.open[kind] = max(0, d-time.Duration(float64(downloaded)/m.mu.bw*float64(time.Second)))
	}
}

// predict returns the predicted duration of a restore of kind that
// downloads bytes, and false while the model has none.
func (m *restoreModel) predict(kind string, download int64) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	open, ok := m.mu.open[kind]
	if !ok || (download > 0 && m.mu.bw <= 0) {
		return 0, false
	}
	if download == 0 {
		return open, true
	}
	return open + time.Duration(float64(download)/m.mu.bw*float64(time.Second)), true
}

// calibrated reports whether the model predicts a restore of kind from the
// store.
func (m *restoreModel) calibrated(kind string) bool {
	_, ok := m.predict(kind, 1)
	return ok
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
