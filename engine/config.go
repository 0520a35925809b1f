// Package engine is the core of cairn: it reads the input stream, runs the
// stateless stages, routes keyed records to slots by key group, runs the keyed
// stage over each slot's state, fires timers on watermarks, injects checkpoint
// barriers and publishes the outputs.
//
// The engine decides; it does not know where checkpoints go or where restored
// state came from. Its caller hands it the slot directories to open and a
// Committer that ships a barrier's local snapshots.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"cairn/internal/base/datadir"
	"cairn/state"
	"cairn/wasm"
)

// Delivery is the output guarantee of a job.
type Delivery string

const (
	// ExactlyOnce publishes to JetStream; on restore the sink skips outputs a
	// key group already has (by Cairn-Out index).
	ExactlyOnce Delivery = "exactly_once"
	// Dedupe publishes to JetStream with a deterministic Nats-Msg-Id and relies
	// on the server's duplicate window.
	Dedupe Delivery = "dedupe"
	// Core publishes to plain core-NATS subjects: at-least-once.
	Core Delivery = "core"
	// Transactional publishes a checkpoint's outputs only after that
	// checkpoint commits; until then they are part of the checkpointed state.
	Transactional Delivery = "transactional"
)

// Emit is which outputs of a key a job publishes.
type Emit string

const (
	// EmitAll publishes every output (the default; "" means it too).
	EmitAll Emit = "all"
	// EmitLatest publishes, per key, only the latest output of each
	// checkpoint interval, the way Kafka Streams' record cache coalesces
	// updates. Only with Transactional delivery: the coalesced set depends
	// on where the barriers fell, so it is sound only where outputs wait in
	// the checkpointed outbox until their checkpoint commits
	// (docs/RATIONALE.md, "emit: latest coalesces in the outbox").
	EmitLatest Emit = "latest"
)

// Operator is one instance of a stage: a WASM instance or a native Go
// operator. An instance is used by one goroutine at a time.
type Operator interface {
	// Process runs one batch. st is nil for stateless stages. A failed call
	// has no effect; the engine discards the instance and makes a new one.
	// An operator logs its own lines (a WASM instance logs the guest's as
	// they arrive, even from a call that fails); Output.Logs is not logged
	// again by the engine.
	Process(ctx context.Context, b *wasm.Batch, st wasm.State) (*wasm.Output, error)
	// Close releases the instance.
	Close(ctx context.Context) error
}

// OperatorFactory makes a fresh instance of a stage for a slot (-1 for a
// stateless stage).
type OperatorFactory func(ctx context.Context, slot int) (Operator, error)

// Stage is one step of the job graph.
type Stage struct {
	Name  string
	Keyed bool
	// TTL of the keyed stage's value state (0: none), measured on the
	// stage's clock.
	TTL time.Duration
	// WallClock grants the stage the wall clock: its ProcTime, its
	// processing-time timers and its TTL follow the machine's clock instead
	// of the log's (ingestion time). A replay then sees other times, so a
	// stage with the wall clock is refused with exactly_once and dedupe
	// delivery (docs/RATIONALE.md, "Processing time is ingestion time").
	WallClock bool
	New       OperatorFactory
}

// Config is everything the engine needs to run a job.
type Config struct {
	Job       string
	KeyGroups int
	Slots     int

	InputStream   string
	InputSubjects []string

	Stages []Stage

	OutputStream  string
	OutputSubject string
	Delivery      Delivery
	// Emit: EmitLatest coalesces the outputs per key and checkpoint
	// interval ("" or EmitAll: every output). Transactional delivery only.
	Emit Emit
	// Publish is how JetStream deliveries publish outputs (default
	// PublishAuto: fast batches when the output stream allows them).
	Publish PublishMode

	// Repartition: the output is a repartition stream read by the next
	// sub-topology of a job graph. Every output carries the watermark
	// before the record or timer that made it, and at every checkpoint each
	// key group gets a watermark marker. Needs exactly_once delivery.
	Repartition bool
	// SlotCacheBytes and SlotMemTableBytes size each slot DB's block
	// cache and memtables (0: state's defaults): a memory budget's shares.
	SlotCacheBytes, SlotMemTableBytes int64
	// Extra are the outputs besides OutputStream/OutputSubject (target
	// 0, fed by port 0): another place for a port's emits (a stage read by
	// two stages), or a named port's (Emit.Port). Every target gets its
	// own per-key-group Cairn-Out indexes, skip and fence. Only with
	// exactly_once or core delivery.
	Extra []OutputTarget
	// UpstreamWatermarks: the input is a repartition stream. The watermark
	// is not computed from the records' event times but taken from the
	// upstream: the least, over the input's key groups (the last token of
	// its subjects), of the last watermark each carried. MaxOutOfOrder is
	// not used.
	UpstreamWatermarks bool
	// UpstreamSides is the number of writers of the repartition input (2:
	// the first stage reads two sides, each on subjects
	// <stream subject>.<side>.<key group>; records carry their side). The
	// watermark is the least over every side's key groups. 0 means 1.
	UpstreamSides int
	// InputTable, when set, names the NATS KV bucket the input stream
	// (KV_<bucket>) is: a record's key is its subject after
	// "$KV.<bucket>.", a KV-Operation DEL or PURGE is a delete record
	// (wasm.Record.Delete), and the watermark it carries into the
	// repartition stream it writes is +inf: a table's changelog does not
	// hold back the event time of what it is joined with.
	InputTable string

	// DeadLetterStream and DeadLetterSubject receive records the job could not
	// process, with the reason.
	DeadLetterStream  string
	DeadLetterSubject string

	// DataDir holds the slot databases and local checkpoints.
	DataDir string
	// SlotDir returns the directory of slot i's database; default
	// DataDir/state/slot-<i>. The caller may have restored state there.
	SlotDir func(slot int) string

	// StartSeq is the first input sequence to consume (checkpoint source_seq+1).
	StartSeq uint64
	// RestoredCheckpoint is the id of the checkpoint the slots' state was
	// restored from (0: none, or not known). A slot trusts the bounds on
	// its timers only if that checkpoint wrote them (timerlow.go).
	RestoredCheckpoint uint64
	// MaxOutOfOrder bounds event-time disorder: the watermark is the largest
	// event time seen minus this bound.
	MaxOutOfOrder time.Duration
	// AllowedLateness: the router admits a record whose event time is at or
	// before the watermark (late) as long as it is less than this far
	// behind it (time > watermark - AllowedLateness); only records further
	// behind are dead letters. Admitted late records do not move the
	// watermark; the keyed stage gets each in a call of its own, at the
	// watermark it was routed at (see slot.handle). It applies on a
	// repartition input too (the upstream's watermark), so what one
	// sub-topology admitted, and a window's late firings, are not dead
	// letters at the next. 0 (default): every late record is a dead letter.
	AllowedLateness time.Duration
	// BatchSize is the most records per operator call.
	BatchSize int
	// QueueDepth is the number of batches buffered between stages.
	QueueDepth int
	// MaxMessageBytes: larger input messages are dead-lettered.
	MaxMessageBytes int
	// MaxKeyBytes: a record (input or emitted by a stage) with a longer key
	// is dead-lettered (default DefaultMaxKeyBytes). Keys travel in the
	// Cairn-Key header, which the server bounds at 64 KiB.
	MaxKeyBytes int
	// MaxFutureSkew: a record whose event time is more than this ahead of
	// its ingestion time (the JetStream timestamp) is dead-lettered instead
	// of moving the watermark (default DefaultMaxFutureSkew; negative: off).
	MaxFutureSkew time.Duration
	// ProcTimeResolution is the step of the processing clock (ingestion
	// time): records whose ingestion times fall into one step share one
	// ProcTime (default DefaultProcTimeResolution).
	ProcTimeResolution time.Duration
	// ProcessingTimerInterval is how often an idle job checks for due
	// processing-time timers (and logs a tick to fire them).
	ProcessingTimerInterval time.Duration
	// TTLSweepInterval is how often a slice of the expired state is removed
	// (default 100 ms; see slot.sweepExpired).
	TTLSweepInterval time.Duration

	// Checkpoint configures barrier checkpoints; nil disables them.
	Checkpoint *CheckpointConfig

	// PublishGuard, when set, is asked before every publish (outputs,
	// markers, dead letters); an error stops the publish and fails the
	// engine with it. A group member's says whether its lease may have
	// lapsed: a member paused past its lease publishes nothing when it
	// resumes.
	PublishGuard func() error
	// FenceEpoch, when not 0, makes the engine a fenced writer of its
	// output streams under this epoch (a group member's ownership of the
	// sub-topology, greater for every new owner): it claims each stream's
	// fence subject at start, refusing to start under a newer claim, every
	// output carries the epoch, and its fast batches check the claim, so
	// the server refuses a writer whose streams a newer one claimed
	// (ErrFenced). See fence.go.
	FenceEpoch uint64
	// OnReplay, when set, is called with every output a restored job
	// regenerated and did not publish because the output stream holds its
	// index: a restore-safety check compares it with the stored one.
	OnReplay func(kg int, idx uint64, key, value []byte, evTime int64)

	Logger *slog.Logger
	// Now is the wall clock (tests inject one).
	Now func() time.Time
}

// CheckpointConfig configures periodic barrier checkpoints.
type CheckpointConfig struct {
	Interval  time.Duration
	Committer Committer
	// Timeout aborts a checkpoint whose async part takes longer.
	Timeout time.Duration
	// OnStop is the checkpoint a graceful stop takes (the zero value: the
	// configured mode; a savepoint for --savepoint-on-stop).
	OnStop CheckpointRequest
}

// CheckpointRequest is what a checkpoint trigger asks for.
type CheckpointRequest struct {
	// Mode is "" (the configured one), "full" or "incremental".
	Mode string
	// Savepoint, when set, makes it a savepoint of this name: full,
	// self-contained, never removed by retention.
	Savepoint string
}

// Committer ships the local snapshots of one barrier to a checkpoint store.
// It runs off the slot goroutines; processing continues meanwhile.
type Committer interface {
	Commit(ctx context.Context, b Barrier) error
}

// Barrier is a completed synchronous checkpoint: every slot's local snapshot.
type Barrier struct {
	ID        uint64
	SourceSeq uint64 // input sequence of the last record routed before the barrier
	Mode      string // per-checkpoint mode override ("" = the committer's default)
	Savepoint string // a savepoint of this name ("": a checkpoint)
	Slots     []state.SlotSnapshot
}

// Defaults of the bad-input bounds and the processing clock.
const (
	DefaultMaxKeyBytes        = 16 << 10
	DefaultMaxFutureSkew      = 5 * time.Minute
	DefaultProcTimeResolution = 10 * time.Millisecond
)

// ErrConfig is returned for an invalid engine configuration.
var ErrConfig = errors.New("engine: invalid config")

func (c *Config) setDefaults() {
	if c.KeyGroups == 0 {
		c.KeyGroups = state.DefaultKeyGroups
	}
	if c.Slots == 0 {
		c.Slots = 1
	}
	if c.Delivery == "" {
		c.Delivery = ExactlyOnce
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.QueueDepth == 0 {
		c.QueueDepth = 8
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 1 << 20
	}
	if c.MaxKeyBytes == 0 {
		c.MaxKeyBytes = DefaultMaxKeyBytes
	}
	if c.MaxFutureSkew == 0 {
		c.MaxFutureSkew = DefaultMaxFutureSkew
	}
	if c.ProcTimeResolution == 0 {
		c.ProcTimeResolution = DefaultProcTimeResolution
	}
	if c.ProcessingTimerInterval == 0 {
		c.ProcessingTimerInterval = 100 * time.Millisecond
	}
	if c.TTLSweepInterval == 0 {
		c.TTLSweepInterval = 100 * time.Millisecond
	}
	if c.DeadLetterSubject == "" {
		c.DeadLetterSubject = "cairn.dlq." + c.Job
	}
	if c.DeadLetterStream == "" {
		c.DeadLetterStream = "CAIRN_DLQ_" + c.Job
	}
	if c.SlotDir == nil {
		dir := c.DataDir
		c.SlotDir = func(i int) string { return datadir.Slot(dir, i) }
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.StartSeq == 0 {
		c.StartSeq = 1
	}
	if c.Checkpoint != nil && c.Checkpoint.Timeout == 0 {
		c.Checkpoint.Timeout = 10 * time.Minute
	}
}

func (c *Config) validate() error {
	bad := func(field, format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, a...))
	}
	if c.Job == "" {
		return bad("name", "must not be empty")
	}
	if err := state.ValidateKeyGroups(c.KeyGroups); err != nil {
		return bad("key_groups", "%v", err)
	}
	if err := state.ValidateSlots(c.Slots, c.KeyGroups); err != nil {
		return bad("slots", "%v", err)
	}
	if c.InputStream == "" {
		return bad("input.stream", "must not be empty")
	}
	if c.OutputSubject == "" {
		return bad("output.subject", "must not be empty")
	}
	switch c.Delivery {
	case ExactlyOnce, Dedupe, Transactional:
		if c.OutputStream == "" {
			return bad("output.stream", "required for delivery %s", c.Delivery)
		}
		if c.Delivery == Transactional && c.Checkpoint == nil {
			return bad("output.delivery", "transactional publishes outputs when checkpoints commit: configure checkpoint")
		}
	case Core:
	default:
		return bad("output.delivery", "unknown %q (want exactly_once, dedupe, transactional or core)", c.Delivery)
	}
	switch c.Emit {
	case "", EmitAll:
	case EmitLatest:
		// A repartition stream and several outputs are exactly_once only
		// (below), so this also keeps coalescing off them.
		if c.Delivery != Transactional {
			return bad("output.emit", "latest coalesces outputs in the transactional outbox; delivery %s publishes each output before any checkpoint seals it, so a replay could not regenerate the same coalesced set: use delivery transactional", c.Delivery)
		}
	default:
		return bad("output.emit", "unknown %q (want all or latest)", c.Emit)
	}
	for _, t := range c.targets() {
		if t.Repartition && c.Delivery != ExactlyOnce {
			return bad("output.delivery", "a repartition stream is written exactly_once, not %s", c.Delivery)
		}
		if t.Subject == "" || (c.Delivery != Core && t.Stream == "") {
			return bad("outputs", "an output needs a stream and a subject")
		}
		if t.Port < 0 || t.Port > 255 {
			return bad("outputs", "port %d out of range", t.Port)
		}
	}
	if len(c.Extra) > 0 && c.Delivery != ExactlyOnce && c.Delivery != Core {
		return bad("output.delivery", "several outputs are written exactly_once or core, not %s", c.Delivery)
	}
	for p, ts := range c.portTargets() {
		if len(ts) == 0 {
			return bad("outputs", "output port %d feeds nothing", p)
		}
	}
	switch c.Publish {
	case PublishAuto, PublishAsync, PublishBatch:
	default:
		return bad("output.publish", "unknown %q (want async or batch)", c.Publish)
	}
	if len(c.Stages) == 0 && !c.Repartition && len(c.Extra) == 0 {
		// A sub-topology with no stage forwards its input into a
		// repartition stream (a side of a two-input stage).
		return bad("stages", "at least one stage is required")
	}
	if c.UpstreamSides < 0 || c.UpstreamSides > 2 || (c.UpstreamSides > 1 && !c.UpstreamWatermarks) {
		return bad("upstream_sides", "%d: a repartition input has one or two sides", c.UpstreamSides)
	}
	for i, s := range c.Stages {
		if s.Keyed && i != len(c.Stages)-1 {
			return bad(fmt.Sprintf("stages[%d]", i), "keyed stage %q must be the last stage (no re-shuffle after a keyed stage)", s.Name)
		}
		if s.New == nil {
			return bad(fmt.Sprintf("stages[%d]", i), "stage %q has no operator", s.Name)
		}
		if s.WallClock && (c.Delivery == ExactlyOnce || c.Delivery == Dedupe) {
			return bad(fmt.Sprintf("stages[%d].clock", i), "stage %q is granted the wall clock, so a replay after a restore regenerates other outputs than the ones already published and delivery %s would skip or drop the wrong ones: use delivery transactional (nothing is visible before its checkpoint commits), or drop \"clock: wall\" so the stage runs on ingestion time", s.Name, c.Delivery)
		}
	}
	if c.DataDir == "" {
		return bad("data_dir", "must not be empty")
	}
	if c.MaxKeyBytes < 1 || c.MaxKeyBytes > 60<<10 {
		return bad("max_key_bytes", "%d must be in [1, %d] (keys travel in a header; the server bounds headers at 64 KiB)", c.MaxKeyBytes, 60<<10)
	}
	if c.AllowedLateness < 0 {
		return bad("watermark.allowed_lateness", "%v must not be negative", c.AllowedLateness)
	}
	if c.ProcTimeResolution < time.Millisecond {
		return bad("processing_time.resolution", "%v is below 1ms", c.ProcTimeResolution)
	}
	if c.Checkpoint != nil && (c.Checkpoint.Interval <= 0 || c.Checkpoint.Committer == nil) {
		return bad("checkpoint", "interval must be > 0 and a store configured")
	}
	return nil
}

// sides is the number of writers of the repartition input (1 without one).
func (c *Config) sides() int { return max(c.UpstreamSides, 1) }

// keyedStage returns the keyed stage index or -1.
func (c *Config) keyedStage() int {
	if n := len(c.Stages); n > 0 && c.Stages[n-1].Keyed {
		return n - 1
	}
	return -1
}

// DefaultBatchSize is a pipeline batch when the job sets none.
const DefaultBatchSize = 512
