// Package par runs bounded parallel work: the uploads of a checkpoint and
// the downloads of a restore.
package par

import (
	"context"

	"golang.org/x/sync/errgroup"
)

// Do runs fn(ctx, i) for i in [0, n) on at most limit goroutines and returns
// the first error. The first error cancels ctx for the calls still running,
// and no new calls start after it. When the caller's ctx ends before every
// call ran, Do returns its error: callers rely on a nil error meaning that
// fn ran for every i.
func Do(ctx context.Context, n, limit int, fn func(ctx context.Context, i int) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(limit, 1))
	for i := range n {
		if gctx.Err() != nil {
			break // an earlier call failed, or the caller gave up: start no more
		}
		g.Go(func() error {
			// Go may have waited for a free slot past a failure.
			if err := gctx.Err(); err != nil {
				return err
			}
			return fn(gctx, i)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}
