package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// jobSnapshot is the part of the job's /api/snapshot the drill reads of a
// graph: each sub-topology's state and each stage's record counts.
type jobSnapshot struct {
	SubTopologies []struct {
		Name       string `json:"name"`
		StateBytes uint64 `json:"state_bytes"`
	} `json:"sub_topologies"`
	Stages []struct {
		SubTopology string `json:"sub_topology"`
		Stage       string `json:"stage"`
		RecordsIn   uint64 `json:"records_in"`
		RecordsOut  uint64 `json:"records_out"`
		DeadLetters uint64 `json:"dead_letters"`
	} `json:"stages"`
}

// readSnapshot reads the job's /api/snapshot.
func readSnapshot(ctx context.Context, p *jobproc.Process) (jobSnapshot, error) {
	var s jobSnapshot
	body, err := p.Get(ctx, "/api/snapshot")
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return s, fmt.Errorf("drill: /api/snapshot: %w", err)
	}
	return s, nil
}

// waitStage waits until the keyed stage stage of sub-topology sub emitted
// want outputs (the builtin count emits one per record it processed),
// reporting progress from done0. A dead letter in any stage fails the wait:
// the state would not be the model's.
func waitStage(ctx context.Context, p *jobproc.Process, sub, stage string, want, done0 int64, prog *phaseProgress) error {
	for {
		snap, err := readSnapshot(ctx, p)
		if err != nil {
			return err
		}
		found := false
		for _, st := range snap.Stages {
			if st.DeadLetters > 0 {
				return fmt.Errorf("drill: stage %s of %s dead-lettered %d records (see job.log)", st.Stage, st.SubTopology, st.DeadLetters)
			}
			if st.SubTopology != sub || st.Stage != stage {
				continue
			}
			found = true
			prog.set(int64(st.RecordsOut) - done0)
			if int64(st.RecordsOut) >= want {
				return nil
			}
		}
		if !found {
			return fmt.Errorf("drill: the job's /api/snapshot has no stage %s of sub-topology %s", stage, sub)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
