package dashboard

// Presenter is what a supervisor that stages failures (cairn demo) tells an
// audience, already in the numbers its presenter view shows: the two numbers
// people mix up side by side, and the story of the last failure. It is
// encoded as it is (seconds as numbers, 0 for "not known yet").
type Presenter struct {
	// Simulates says what the demo stands in for ("527 MiB of keyed state;
	// the store behind a 25MB/s link, 20ms per request").
	Simulates string `json:"simulates"`
	// StateBytes is the logical state: the newest checkpoint's full state.
	StateBytes int64 `json:"state_bytes"`
	// CheckpointP50 is the median duration (sync + async) of the recent
	// checkpoints; StoreRestore the predicted restore of the newest one
	// from the store onto an empty disk, LocalRestore from the node's local
	// copy (kill -9); 0 while calibrating.
	CheckpointP50 float64 `json:"checkpoint_p50_seconds"`
	StoreRestore  float64 `json:"store_restore_seconds"`
	LocalRestore  float64 `json:"local_restore_seconds"`
	// OnlineFirst is the predicted time until an online restore from the
	// store processes (0: not predicted).
	OnlineFirst float64 `json:"online_first_seconds"`
	// Budget is the one line the presenter points at: the recovery budget
	// from the checkpoint duration vs from a restore.
	Budget string `json:"budget"`
	// Last is the last failure and how the job came back (nil: none yet).
	Last *Failure `json:"last_failure,omitempty"`
	// ChainVsFull compares a restore of the newest incremental checkpoint
	// (after its chain) with one of the newest full checkpoint.
	ChainVsFull *ChainVsFull `json:"chain_vs_full,omitempty"`
	// Storage is the store's retained bytes against the logical state.
	Storage *Storage `json:"storage,omitempty"`
	// Rescale is the last rescale's preview and result (nil: none yet).
	Rescale *Rescale `json:"rescale,omitempty"`
}

// Failure is one staged failure and the restart after it.
type Failure struct {
	Kind            string   `json:"kind"` // "kill -9", "lose the disk", ...
	TimeMs          int64    `json:"time_ms"`
	CheckpointID    uint64   `json:"checkpoint_id"`
	Mode            string   `json:"mode"`
	Chain           int      `json:"chain"`
	BytesLocal      int64    `json:"bytes_local"`
	BytesDownloaded int64    `json:"bytes_downloaded"`
	Predicted       float64  `json:"predicted_seconds"`    // before the restore ran (0: calibrating)
	Restored        float64  `json:"restored_seconds"`     // the measured restore (0: not yet)
	FirstOutput     float64  `json:"first_output_seconds"` // restart to the first output (0: not yet)
	FullyLocal      float64  `json:"fully_local_seconds"`  // an online restore: restart to fully local (0: not yet or not online)
	CaughtUp        float64  `json:"caught_up_seconds"`    // failure to caught up (0: not yet)
	Online          bool     `json:"online"`
	Lines           []string `json:"lines"`
}

// ChainVsFull is a restore after a chain of incremental checkpoints beside
// one right after a full checkpoint, predicted and (once one ran) measured.
type ChainVsFull struct {
	ChainID       uint64  `json:"chain_id"`
	Chain         int     `json:"chain"`
	ChainFiles    int     `json:"chain_files"`
	ChainRestore  float64 `json:"chain_restore_seconds"`
	ChainMeasured float64 `json:"chain_measured_seconds"`
	FullID        uint64  `json:"full_id"`
	FullRestore   float64 `json:"full_restore_seconds"`
	FullMeasured  float64 `json:"full_measured_seconds"`
}

// Storage is the store's footprint.
type Storage struct {
	Retained    int64 `json:"retained_bytes"`     // every object the retained checkpoints and savepoints reference
	Logical     int64 `json:"logical_bytes"`      // the newest checkpoint's full state
	Checkpoints int   `json:"checkpoints"`        // retained checkpoints
	Savepoints  int   `json:"savepoints"`         // savepoints (never deleted by retention)
	RetainOne   int64 `json:"retain_one_bytes"`   // what retaining only the newest checkpoint (and the savepoints) would keep
	SavedByOne  int64 `json:"saved_by_one_bytes"` // Retained - RetainOne
}

// Rescale is a rescale's preview and, once it ran, its measured restore.
type Rescale struct {
	FromSlots    int     `json:"from_slots"`
	ToSlots      int     `json:"to_slots"`
	BytesPerSlot []int64 `json:"bytes_per_slot"`    // what each new slot fetches from the store
	LocalPerSlot []int64 `json:"local_per_slot"`    // and links from the local copy
	Predicted    float64 `json:"predicted_seconds"` // 0: calibrating
	Measured     float64 `json:"measured_seconds"`  // 0: not yet
	Preview      string  `json:"preview"`
}

// Sample is one point of the throughput and lag charts, kept by the server
// so that a reload of the page does not lose them.
type Sample struct {
	TimeMs     int64  `json:"t"`
	RecordsIn  uint64 `json:"in"`
	RecordsOut uint64 `json:"out"`
	Lag        uint64 `json:"lag"`
}
