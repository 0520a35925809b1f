package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"cairn/checkpoint"
)

// IsBroken reports whether err is a missing or corrupt object of a
// checkpoint: the case a fallback to an older checkpoint can help with.
func IsBroken(err error) bool {
	return errors.Is(err, checkpoint.ErrNotFound) || checkpoint.IsCorruption(err)
}

// RestorePrevious restores the newest intact committed checkpoint older
// than broken (restore.fallback: previous), and says so in the log; cause
// is why broken could not be restored. Manifests that do not decode are
// skipped like broken objects.
func RestorePrevious(ctx context.Context, broken uint64, cause error, o Options) (*Result, error) {
	ms, _, err := checkpoint.LoadIntact(ctx, o.Store, o.Job)
	if err != nil {
		return nil, errors.Join(cause, err)
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	for i := len(ms) - 1; i >= 0; i-- {
		m := ms[i]
		if m.ID >= broken {
			continue
		}
		log.Warn("restore.fallback: previous: the newest checkpoint is broken; restoring an older one (its input since is replayed)",
			"cause", cause, "restoring", m.ID)
		res, err := Restore(ctx, m, o)
		if err == nil || !IsBroken(err) {
			return res, err
		}
		cause, broken = err, m.ID
	}
	return nil, fmt.Errorf("restore.fallback: no intact checkpoint older than the broken one: %w", cause)
}
