// Package par runs bounded parallel work: the uploads of a checkpoint and
// the downloads of a restore.
package par

import (
	"context"

	"golang.org/x/sync/errgroup"
)

// Do runs fn(ctx, i) for i in [0, n) on at most limit goroutines and returns
// the first error. The first error cancels ctx for the calls still running,
// and no new calls start after it.
func Do(ctx context.Context, n, limit int, fn func(ctx context.Context, i int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(max(limit, 1))
	for i := range n {
		if ctx.Err() != nil {
			break // an earlier call failed: start no more
		}
		g.Go(func() error { return fn(ctx, i) })
	}
	return g.Wait()
}
