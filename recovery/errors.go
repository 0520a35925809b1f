package recovery

import (
	"errors"

	"cairn/checkpoint"
)

// ErrWrongJob is returned (wrapped) when a manifest belongs to another job.
var ErrWrongJob = checkpoint.ErrWrongJob

// ErrKeyGroupsMismatch is returned (wrapped) when a checkpoint's key_groups
// differs from the job's: key_groups can never change for a job's state.
var ErrKeyGroupsMismatch = checkpoint.ErrKeyGroupsMismatch

// ErrSlotCount is returned (wrapped) for a target slot count below 1, above
// key_groups, or above 4x the checkpoint's slot count.
var ErrSlotCount = errors.New("recovery: unsupported target slot count")

// ErrBadSpec is returned (wrapped) by Select for a --restore value it does
// not understand.
var ErrBadSpec = errors.New("recovery: bad restore spec")

// MaxRescaleFactor bounds a rescaled restore: at most this many times the
// checkpoint's slot count.
const MaxRescaleFactor = 4

// ErrStreamMismatch is returned (wrapped) for a checkpoint taken of another
// input stream than the job's.
var ErrStreamMismatch = errors.New("recovery: checkpoint is of another input stream")
