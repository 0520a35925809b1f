package drill

import (
	"context"
	"errors"
	"time"

	"cairn/internal/app/jobproc"
)

// waitProcessed waits until the job has processed every input message up
// to seq, reporting progress in messages from done0.
func waitProcessed(ctx context.Context, c *jobproc.Process, seq, done0 uint64, prog *phaseProgress) error {
	for {
		st, err := c.Stats(ctx)
		if err != nil {
			return err
		}
		prog.set(int64(st.ProcessedSeq) - int64(done0))
		if st.ProcessedSeq >= seq {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkpointTaken is the job's answer to a checkpoint action.
type checkpointTaken = jobproc.Checkpoint

var errNoBinary = errors.New("drill: Config.Binary (the cairn executable that runs the job) is required")
