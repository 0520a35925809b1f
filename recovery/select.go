package recovery

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"cairn/checkpoint"
)

// Select resolves a --restore value to the manifest to restore:
//
//	"" or "latest"     the newest committed checkpoint; nil, nil when the
//	                   job has none (a first start)
//	"none"             nil, nil: start with empty state
//	"<id>"             checkpoint id (decimal); ErrNotFound when absent
//	"savepoint:<name>" savepoint name under <job>/savepoints/
//
// A manifest of an unknown format version fails with an error wrapping
// checkpoint.ErrUnsupportedVersion; one naming another job with ErrWrongJob.
func Select(ctx context.Context, store checkpoint.Store, job, spec string) (*checkpoint.Manifest, error) {
	switch {
	case spec == "" || spec == "latest":
		m, err := checkpoint.Latest(ctx, store, job)
		if errors.Is(err, checkpoint.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("recovery: select latest checkpoint of %s: %w", job, err)
		}
		if m.Job != job {
			return nil, fmt.Errorf("recovery: checkpoint %d under %s names job %q: %w", m.ID, job, m.Job, ErrWrongJob)
		}
		return m, nil
	case spec == "none":
		return nil, nil
	case strings.HasPrefix(spec, "savepoint:"):
		name := strings.TrimPrefix(spec, "savepoint:")
		m, err := checkpoint.LoadSavepoint(ctx, store, job, name)
		if err != nil {
			return nil, fmt.Errorf("recovery: select savepoint %q of %s: %w", name, job, err)
		}
		return m, nil
	}
	id, err := strconv.ParseUint(spec, 10, 64)
	if err != nil || id == 0 {
		return nil, fmt.Errorf("recovery: --restore %q: %w (use latest, none, a checkpoint id, or savepoint:NAME)", spec, ErrBadSpec)
	}
	m, err := checkpoint.Load(ctx, store, job, id)
	if err != nil {
		return nil, fmt.Errorf("recovery: select checkpoint %d of %s: %w (list them with `cairn checkpoints ls`)", id, job, err)
	}
	return m, nil
}
