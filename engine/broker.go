package engine

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
)

// Broker is everything the engine needs of the log it reads and writes: the
// input in stream order, per-key-group output partitions, a dead-letter
// subject. The engine's decisions (routing, clocks, barriers, timers, the
// skip and fence of each output, the outbox) never touch the network; the
// NATS JetStream adapter (natsBroker) is one implementation, the trace
// tests' in-memory log another.
type Broker interface {
	// Prepare makes the input, output and dead-letter streams exist and
	// says what the log offers the job (Prepared).
	Prepare(ctx context.Context, req PrepareRequest) (Prepared, error)
	// LastOutputs is what output target's stream holds of every key
	// group: the last output's Cairn-Out index and its stream sequence.
	LastOutputs(ctx context.Context, target int) (map[int]LastOutput, error)
	// NewPublisher makes a publisher of output target for one goroutine (a
	// slot or, target 0, the pipeline's dead letters). fail is called with
	// an error that must stop the job.
	NewPublisher(target int, batched bool, fail func(error), failed <-chan struct{}) (Publisher, error)
	// Consume delivers the input from startSeq on, in stream order, on the
	// returned channel until stop is called or ctx ends; done is closed
	// once nothing more will be sent.
	Consume(ctx context.Context, startSeq uint64, filters []string) (msgs <-chan Message, stop func(), done <-chan struct{}, err error)
}

// PrepareRequest is what a job asks of its log before it starts.
type PrepareRequest struct {
	// Tick is the subject the job logs its processing-time ticks on, into
	// its input ("": the job has no processing-time timers).
	Tick string
	// DuplicateWindow, with dedupe delivery, is how far back the output
	// stream must recognise a replayed message (a checkpoint interval and
	// a restore); a log whose window is shorter warns (0: no check).
	DuplicateWindow time.Duration
}

// Prepared is what the log offers a job.
type Prepared struct {
	// Batch reports whether the output stream takes fast-batch publishes.
	Batch bool
	// Tick logs a processing-time tick into the input; nil when the input
	// cannot take ticks (idle timers then fire with the next record).
	Tick func(ctx context.Context) error
	// TickSubject is the subject Tick logs on ("" when Tick is nil).
	TickSubject string
}

// Message is one input message as the source delivers it.
type Message struct {
	Seq     uint64 // stream sequence
	TsNanos int64  // the stream's timestamp (ingestion time), Unix ns
	Subject string
	Header  nats.Header
	Data    []byte
}

// LastOutput is what the output stream already holds of a key group.
type LastOutput struct {
	Index      uint64 // Cairn-Out of the last output (0: none)
	SubjectSeq uint64 // its stream sequence, for the publish fence
	// Source is the Cairn-Src of the last message: on a table input's
	// repartition stream, the last KV entry forwarded (0: none).
	Source uint64
	// Wm is the watermark (Cairn-Wm) the last message carried
	// (math.MinInt64: none).
	Wm int64
}

// Output is one message a Publisher appends to a key group's subject.
type Output struct {
	KeyGroup int
	// Index is the output's Cairn-Out: its place among the key group's
	// outputs (a marker carries the key group's last).
	Index uint64
	// Key, Value and Time (event time, Unix ms) are the record (none on a
	// marker).
	Key, Value []byte
	Time       int64
	// Wm is the job's watermark before the record or timer that made the
	// output; a repartition stream carries it (HeaderWatermark) so the
	// downstream sub-topology's watermark follows its upstream's
	// (math.MinInt64: none yet).
	Wm int64
	// Fence, when not 0, is the subject's expected last stream sequence.
	Fence uint64
	Meta  OutputMeta
	// Marker makes this a watermark marker on a repartition stream: no
	// record, the key group's last output index and the watermark. Every
	// key group gets one at every checkpoint, so the downstream's
	// watermark advances even for key groups with no outputs.
	Marker bool
}

// OutputMeta is what an output carries besides its record.
type OutputMeta struct {
	// Delete marks a table's delete record (HeaderDelete).
	Delete bool
	// Source, on a table input's outputs, is the KV entry's stream
	// sequence (HeaderSource; 0: none).
	Source uint64
}

// Publisher publishes one goroutine's outputs and dead letters. Outputs of
// a key group are published by one publisher, in order.
type Publisher interface {
	// Publish appends o to its key group's subject: an output, or with
	// o.Marker a watermark marker. A non-zero o.Fence is the key group's
	// expected last stream sequence: the publish fails if another writer
	// appended since. Publishes are asynchronous and bounded by the
	// publisher's own timeout; Fence and Flush wait for them.
	Publish(o Output) error
	// DeadLetter publishes a record the job could not process, with the
	// reason; it always fits the server's limits.
	DeadLetter(h nats.Header, data []byte, stage string, seq uint64, reason error) error
	// Fence returns a channel closed once every publish issued so far is
	// persisted.
	Fence() <-chan struct{}
	// Idle is called periodically; a publisher may commit an open batch.
	Idle()
	// Flush waits until everything published is persisted.
	Flush(ctx context.Context) error
	// MaxPayload is the largest message (headers and payload) the server
	// takes; 0: no bound.
	MaxPayload() int64
}
