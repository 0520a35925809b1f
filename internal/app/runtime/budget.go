package runtime

import (
	"fmt"
	"time"

	"cairn/checkpoint"
	"cairn/recovery"
	"cairn/recovery/model"
)

// The restore budget (docs/RATIONALE.md, "The restore budget"): checkpoint.restore_budget bounds the predicted restore of the
// newest checkpoint from the store.
//
// An incremental checkpoint's restore downloads every SST it references —
// the whole live state, however short its chain — so its cost follows the
// state size, and the chain length adds only objects (the latency term).
// A full checkpoint is the canonical format: about half the bytes (zstd),
// plus a decode and ingest per GiB. Which restores faster depends on the
// bandwidth, which the restore model measures (an open time not yet
// calibrated counts as 0: the budget acts before the node's first restore,
// and the fetch dominates). So before each checkpoint
// that the engine did not ask a mode for, budgetMode predicts what the
// next incremental checkpoint would cost to restore (the newest
// incremental one's figures, 10% of headroom for the interval's growth)
// and, when that crosses the budget and a full checkpoint is predicted to
// restore faster, makes this one full. The chain is cut before the budget
// is crossed, not after.

// budgetHeadroom is the growth allowed for one interval: an incremental
// checkpoint predicted at more than budget/budgetHeadroom is not taken.
const budgetHeadroom = 1.1

// budgetDecision is what budgetMode decided and why.
type budgetDecision struct {
	// Full is true when the next checkpoint should be full.
	Full bool
	// Reason says why (logged, and shown on the dashboard), "" when the
	// budget does not apply or is met.
	Reason string
	// Unmet is set when neither mode is predicted within the budget.
	Unmet bool
}

// budgetState is what the restore budget remembers across checkpoints.
type budgetState struct {
	// incBytes and incObjects are the newest incremental checkpoint's
	// referenced bytes and objects.
	incBytes   int64
	incObjects int
	// ratio is a full checkpoint's size over the native state's, measured
	// by the newest full checkpoint against the incremental one before it
	// (0: not measured).
	ratio float64
	// incMeasured is set when incBytes comes from an incremental
	// checkpoint since the last full one (not derived from the ratio).
	incMeasured bool
}

// observe updates the state with a committed checkpoint.
func (b *budgetState) observe(m *checkpoint.Manifest) {
	f := m.Figures
	switch m.Mode {
	case checkpoint.ModeIncremental:
		b.incBytes, b.incObjects, b.incMeasured = f.FullStateSize, f.FilesUploaded+f.FilesReused, true
	case checkpoint.ModeFull:
		if b.incMeasured && b.incBytes > 0 && f.FullStateSize > 0 {
			b.ratio = float64(f.FullStateSize) / float64(b.incBytes)
		}
		b.incMeasured = false
		if b.ratio > 0 {
			// The native state now, as the full checkpoint measured it.
			b.incBytes = int64(float64(f.FullStateSize) / b.ratio)
		}
	}
}

// budgetMode decides the mode of the next checkpoint under budget, from what
// the earlier checkpoints measured and the restore model.
func budgetMode(budget time.Duration, b budgetState, slots, keyGroups int, mod *model.Model) budgetDecision {
	if budget <= 0 || mod == nil || b.incBytes <= 0 {
		return budgetDecision{}
	}
	inc := mod.PredictLowerBound(recovery.StoreInput(checkpoint.ModeIncremental, slots, keyGroups, checkpoint.Figures{FullStateSize: b.incBytes, FilesUploaded: b.incObjects}))
	if !inc.OK || inc.Seconds*budgetHeadroom <= budget.Seconds() {
		return budgetDecision{}
	}
	incText := fmt.Sprintf("an incremental checkpoint is predicted to restore from the store in %s (%s)", model.Seconds(inc.Seconds), inc.Short())
	if b.ratio <= 0 {
		return budgetDecision{Full: true, Reason: fmt.Sprintf("restore_budget %s: %s; no full checkpoint was measured yet: this one measures it", budget, incText)}
	}
	full := mod.PredictLowerBound(recovery.StoreInput(checkpoint.ModeFull, slots, keyGroups, checkpoint.Figures{FullStateSize: int64(float64(b.incBytes) * b.ratio), FilesUploaded: 2 * max(1, slots)}))
	switch {
	case !full.OK && b.ratio < fullFetchGain:
		// Its fetch alone (the decode unknown) is a lower bound.
		fetch := mod.PredictLowerBound(recovery.StoreInput(checkpoint.ModeIncremental, slots, keyGroups, checkpoint.Figures{FullStateSize: int64(float64(b.incBytes) * b.ratio), FilesUploaded: 2 * max(1, slots)}))
		return budgetDecision{Full: true, Unmet: fetch.OK && fetch.Seconds > budget.Seconds(),
			Reason: fmt.Sprintf("restore_budget %s: %s; a full one fetches %.0f%% of those bytes (its decode time is not calibrated yet)", budget, incText, b.ratio*100)}
	case !full.OK:
		return budgetDecision{Unmet: true, Reason: fmt.Sprintf("restore_budget %s cannot be met: %s, and a full one fetches as much (%.0f%%) and must be decoded", budget, incText, b.ratio*100)}
	case full.Seconds < inc.Seconds:
		return budgetDecision{Full: true, Unmet: full.Seconds > budget.Seconds(), Reason: fmt.Sprintf("restore_budget %s: %s; a full one in %s", budget, incText, model.Seconds(full.Seconds))}
	}
	return budgetDecision{Unmet: true, Reason: fmt.Sprintf("restore_budget %s cannot be met: %s, and a full one in %s", budget, incText, model.Seconds(full.Seconds))}
}

// fullFetchGain: while the decode term is not calibrated, a full checkpoint
// is chosen only if it fetches less than this share of the incremental
// one's bytes.
const fullFetchGain = 0.8
