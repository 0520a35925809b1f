package dashboard

import (
	"errors"
	"io/fs"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"cairn/internal/base/sysfile"
)

// Checkpoint results, the values of the "result" label of cairn_checkpoints_total.
const (
	resultCompleted = "completed"
	resultFailed    = "failed"
)

// restoreSources are always exported by cairn_restores_total, at 0 until one happens, so
// that rate() and increase() see the first one.
var restoreSources = []string{"store", "local", "standby", "savepoint"}

var (
	// checkpointBuckets span a sync phase of a few milliseconds (hard links) to an upload of
	// several minutes over a slow link.
	checkpointBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	// restoreBuckets span opening local files (well under a second) to downloading GiBs.
	restoreBuckets = []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
)

// collector is a prometheus.Collector computing every figure from one Source.Snapshot per
// scrape. Gauges and the last-checkpoint and last-restore figures come straight from the
// snapshot; counters of checkpoints and restores and the duration histograms are built
// from the histories, observing each entry once.
type collector struct {
	src Source

	job, slots, keyGroups                               *prometheus.Desc
	recordsIn, recordsOut, deadLetters, outputsSkipped  *prometheus.Desc
	repeatsDropped                                      *prometheus.Desc
	upstreamMissing                                     *prometheus.Desc
	lag, consumedSeq, processedSeq, streamLastSeq       *prometheus.Desc
	watermark, stateBytes                               *prometheus.Desc
	subIn, subOut, subLag, subState, subWm              *prometheus.Desc
	checkpoints                                         *prometheus.Desc
	ckID, ckTime, ckSync, ckAsync                       *prometheus.Desc
	ckUploaded, ckFullState, ckFilesUp, ckFilesReused   *prometheus.Desc
	ckChain, ckRetainedExcl, ckRetainedShared, ckPredic *prometheus.Desc
	restores                                            *prometheus.Desc
	rsDuration, rsLocal, rsDownloaded, rsFiles          *prometheus.Desc
	rsRescaled, rsChain, rsCheckpointID                 *prometheus.Desc
	rsRemote, rsFullyLocal                              *prometheus.Desc
	latency                                             *prometheus.Desc
	sbCheckpoints, sbBytes, sbLastSynced                *prometheus.Desc
	diskBytes                                           *prometheus.Desc
	stUnbounded, stGrowth                               *prometheus.Desc
	brokerWait, brokerResumes                           *prometheus.Desc

	// disk measures the data directories of a DiskSource; nil for other sources.
	disk *diskUsage
	// memory is the budget of a MemorySource; nil for other sources.
	memory      MemorySource
	memoryShare *prometheus.Desc
	// stages counts the records of a StageSource's stages; nil for other
	// sources (and then so are the descs).
	stages                       StageSource
	stageIn, stageOut, stageDead *prometheus.Desc

	syncHist    *prometheus.HistogramVec // label mode
	asyncHist   *prometheus.HistogramVec // label mode
	restoreHist *prometheus.HistogramVec // label source

	mu struct {
		sync.Mutex
		// seenCheckpoints and seenRestores are the history entries already counted and
		// observed. INVARIANT: they only hold entries of the last non-empty history, so
		// they stay as small as the Source's bound.
		seenCheckpoints map[checkpointKey]struct{}
		seenRestores    map[restoreKey]struct{}
		// checkpoints counts observed checkpoints by result.
		checkpoints map[string]uint64
		// restores counts observed restores by source.
		restores map[string]uint64
	}
}

type checkpointKey struct {
	id   uint64
	time int64
}

type restoreKey struct {
	checkpointID uint64
	time         int64
	source       string
	toSlots      int
}

var _ prometheus.Collector = (*collector)(nil)

// NewCollector returns a prometheus.Collector over src: it takes one Snapshot per scrape
// and exports every figure under the prefix "cairn_". Counters of checkpoints and restores
// and the duration histograms count the history entries seen since the collector was made,
// each once, so a collector must be made once per process and registered once.
func NewCollector(src Source) prometheus.Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("cairn_"+name, help, labels, nil)
	}
	c := &collector{
		src:       src,
		job:       d("job_info", "The job this process runs (value always 1).", "job"),
		slots:     d("slots", "Number of slots (parallel keyed workers, one Pebble instance each)."),
		keyGroups: d("key_groups", "Number of key groups (the unit of rescaling)."),

		recordsIn:       d("records_in_total", "Records read from the input stream."),
		recordsOut:      d("records_out_total", "Records published to the output."),
		deadLetters:     d("records_dead_lettered_total", "Records sent to the dead-letter stream (late, or failed in an operator)."),
		outputsSkipped:  d("outputs_skipped_total", "Outputs regenerated after a restore and skipped because they were already published."),
		repeatsDropped:  d("repartition_repeats_dropped_total", "Repartition messages dropped because they repeat an output index already read (a late copy from a writer that lost its key group)."),
		upstreamMissing: d("repartition_upstream_outputs_missing_total", "Upstream outputs a repartition stream's messages jumped over: the stream lost them, or the writer dead-lettered them after indexing. Above 0 without dead letters upstream, records were lost."),

		lag:           d("consumer_lag_messages", "Messages in the input stream not yet processed (stream last sequence - processed sequence)."),
		consumedSeq:   d("source_consumed_sequence", "Last input stream sequence read from the broker."),
		processedSeq:  d("source_processed_sequence", "Last input stream sequence fully processed."),
		streamLastSeq: d("source_stream_last_sequence", "Last sequence in the input stream."),
		watermark:     d("watermark_timestamp_seconds", "Event-time watermark as a Unix timestamp; absent until the first event."),
		stateBytes:    d("state_size_bytes", "Size of the local state of a slot.", "slot"),

		subIn:    d("subtopology_records_in_total", "Records a sub-topology of a job graph read (from the input or a repartition stream).", "sub_topology"),
		subOut:   d("subtopology_records_out_total", "Records a sub-topology of a job graph published (to a repartition stream or the output).", "sub_topology"),
		subLag:   d("subtopology_lag_messages", "Messages of a sub-topology's input stream (the job's input or a repartition stream) not yet processed.", "sub_topology"),
		subState: d("subtopology_state_size_bytes", "Local state of a sub-topology, all slots.", "sub_topology"),
		subWm:    d("subtopology_watermark_timestamp_seconds", "Event-time watermark of a sub-topology as a Unix timestamp; absent until the first.", "sub_topology"),

		checkpoints:      d("checkpoints_total", "Finished checkpoint attempts, by result (completed or failed).", "result"),
		ckID:             d("checkpoint_last_id", "Id of the last completed checkpoint."),
		ckTime:           d("checkpoint_last_timestamp_seconds", "Time of the last completed checkpoint as a Unix timestamp."),
		ckSync:           d("checkpoint_last_sync_duration_seconds", "Synchronous part (processing paused) of the last completed checkpoint."),
		ckAsync:          d("checkpoint_last_async_duration_seconds", "Asynchronous part (upload and commit) of the last completed checkpoint."),
		ckUploaded:       d("checkpoint_last_uploaded_bytes", "Bytes uploaded by the last completed checkpoint."),
		ckFullState:      d("checkpoint_last_full_state_bytes", "Full state size referenced by the last completed checkpoint."),
		ckFilesUp:        d("checkpoint_last_uploaded_files", "Files uploaded by the last completed checkpoint."),
		ckFilesReused:    d("checkpoint_last_reused_files", "Files the last completed checkpoint reused from earlier ones."),
		ckChain:          d("checkpoint_last_chain_length", "Checkpoints whose files the last completed checkpoint references (1 for a full one)."),
		ckRetainedExcl:   d("checkpoint_retained_exclusive_bytes", "Retained storage referenced by one checkpoint only, as of the last completed checkpoint."),
		ckRetainedShared: d("checkpoint_retained_shared_bytes", "Retained storage shared by several checkpoints, as of the last completed checkpoint."),
		ckPredic:         d("checkpoint_last_predicted_restore_seconds", "Predicted restore time of the last completed checkpoint from the store (the restore model: fetch + per-object latency + rebuild + open, each term measured); 0 while calibrating."),

		restores:       d("restores_total", "Restores, by where the state came from (store, local, standby, savepoint).", "source"),
		rsDuration:     d("restore_last_duration_seconds", "Duration of the last restore."),
		rsLocal:        d("restore_last_local_bytes", "Bytes the last restore read from local disk."),
		rsDownloaded:   d("restore_last_downloaded_bytes", "Bytes the last restore downloaded from the store."),
		rsFiles:        d("restore_last_files", "Files the last restore used."),
		rsRescaled:     d("restore_last_rescaled", "1 if the last restore changed the number of slots, else 0."),
		rsChain:        d("restore_last_chain_length", "Chain length of the checkpoint the last restore used."),
		rsCheckpointID: d("restore_last_checkpoint_id", "Id of the checkpoint the last restore used."),
		latency:        d("record_latency_seconds", "Time from a record's arrival in the input stream (its JetStream timestamp) until its slot processed it and handed its outputs to the publisher; a job graph's last sub-topology counts from its repartition stream. Records replayed after a restore count with their original arrival."),
		rsRemote:       d("restore_remote_bytes", "Bytes of the last restore still read remotely from the store (an online restore downloading in the background; 0 once fully local)."),
		rsFullyLocal:   d("restore_last_fully_local_seconds", "Time from the start of processing until an online restore's state was fully local; absent while downloading or for a restore that downloaded first."),

		sbCheckpoints: d("standby_lag_checkpoints", "Checkpoints the standby has not synced yet."),
		sbBytes:       d("standby_lag_bytes", "Bytes the standby has not synced yet."),
		sbLastSynced:  d("standby_last_synced_checkpoint_id", "Id of the last checkpoint the standby synced."),

		brokerWait:    d("broker_waiting_seconds", "Present while the job waits for its broker between two runs in its process, labelled with why (stream_full: an output or repartition stream, or the account, at its limit with discard new; publish_lost: publishes lost with the connection, waiting for the server) and the stream: how long it has waited. No record is dead-lettered for it; the job resumes from its last committed checkpoint.", "reason", "stream"),
		brokerResumes: d("broker_resumes_total", "Runs the job resumed in its process after a broker fault it outlives (a full stream, publishes lost with the connection)."),
		stUnbounded:   d("state_unbounded", "1 while the state of a stage grows without bound (missing TTL?): it rose over many checkpoint intervals while the records read per interval (the proxy for keys written) stayed flat; else 0.", "stage"),
		stGrowth:      d("state_growth_bytes_per_second", "Growth of the state of a stage, a linear fit over its last checkpoint intervals (negative: shrinking).", "stage"),

		diskBytes: d("disk_allocated_bytes", "Disk space (allocated blocks, as du counts) of a component: state (per slot), checkpoints (local copies), nats (the embedded server's store), store (a file:// checkpoint store in the data directory). A file hard-linked into several components counts once, in the first (state before checkpoints). Measured at most every 5 s.", "component", "slot"),

		syncHist: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cairn_checkpoint_sync_duration_seconds", Buckets: checkpointBuckets,
			Help: "Synchronous part of completed checkpoints (processing paused), by mode.",
		}, []string{"mode"}),
		asyncHist: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cairn_checkpoint_async_duration_seconds", Buckets: checkpointBuckets,
			Help: "Asynchronous part of completed checkpoints (upload and commit), by mode.",
		}, []string{"mode"}),
		restoreHist: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cairn_restore_duration_seconds", Buckets: restoreBuckets,
			Help: "Duration of restores, by where the state came from.",
		}, []string{"source"}),
	}
	c.mu.seenCheckpoints = map[checkpointKey]struct{}{}
	c.mu.seenRestores = map[restoreKey]struct{}{}
	c.mu.checkpoints = map[string]uint64{resultCompleted: 0, resultFailed: 0}
	c.mu.restores = map[string]uint64{}
	if ds, ok := src.(DiskSource); ok {
		c.disk = &diskUsage{src: ds, every: diskInterval}
	}
	if ms, ok := src.(MemorySource); ok {
		c.memory = ms
		c.memoryShare = d("memory_budget_bytes", "The memory budget (memory: in the job file) and its division: total, pebble_cache and pebble_memtables (all slots), operators (instances' limits), nats (the embedded server's JetStream memory), go_limit (the Go runtime's soft limit). Absent without a budget; the process's resident memory is process_resident_memory_bytes.", "component")
	}
	if ss, ok := src.(StageSource); ok {
		c.stages = ss
		c.stageIn = d("stage_records_in_total", "Records a stage was given: the first stateless stage's are the records decoded from its sub-topology's input, a later one's what the stage before it emitted, a keyed stage's the records routed to its slots (not the late ones the router dead-lettered).", "sub_topology", "stage")
		c.stageOut = d("stage_records_out_total", "Records a stage emitted: a stateless stage's to the next stage (or the router), a keyed stage's outputs, once per place its port feeds.", "sub_topology", "stage")
		c.stageDead = d("stage_records_dead_lettered_total", "Records a stage dead-lettered: a stateless stage's records that failed in it; a keyed stage's records that failed in it and its outputs that could not be published.", "sub_topology", "stage")
	}
	for _, s := range restoreSources {
		c.mu.restores[s] = 0
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.job, c.slots, c.keyGroups,
		c.recordsIn, c.recordsOut, c.deadLetters, c.outputsSkipped, c.repeatsDropped, c.upstreamMissing,
		c.lag, c.consumedSeq, c.processedSeq, c.streamLastSeq, c.watermark, c.stateBytes,
		c.subIn, c.subOut, c.subLag, c.subState, c.subWm,
		c.checkpoints, c.ckID, c.ckTime, c.ckSync, c.ckAsync,
		c.ckUploaded, c.ckFullState, c.ckFilesUp, c.ckFilesReused,
		c.ckChain, c.ckRetainedExcl, c.ckRetainedShared, c.ckPredic,
		c.restores, c.rsDuration, c.rsLocal, c.rsDownloaded, c.rsFiles, c.rsRescaled, c.rsChain, c.rsCheckpointID, c.rsRemote, c.rsFullyLocal, c.latency,
		c.sbCheckpoints, c.sbBytes, c.sbLastSynced, c.diskBytes,
		c.stUnbounded, c.stGrowth, c.brokerWait, c.brokerResumes,
	} {
		ch <- d
	}
	if c.memoryShare != nil {
		ch <- c.memoryShare
	}
	if c.stages != nil {
		ch <- c.stageIn
		ch <- c.stageOut
		ch <- c.stageDead
	}
	c.syncHist.Describe(ch)
	c.asyncHist.Describe(ch)
	c.restoreHist.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Snapshot()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}

	if s.Job != "" {
		gauge(c.job, 1, s.Job)
	}
	gauge(c.slots, float64(s.Slots))
	gauge(c.keyGroups, float64(s.KeyGroups))
	counter(c.recordsIn, float64(s.RecordsIn))
	counter(c.recordsOut, float64(s.RecordsOut))
	counter(c.deadLetters, float64(s.DeadLetters))
	counter(c.outputsSkipped, float64(s.OutputsSkipped))
	counter(c.repeatsDropped, float64(s.RepeatsDropped))
	counter(c.upstreamMissing, float64(s.UpstreamMissing))
	if !s.LagUnknown {
		gauge(c.lag, float64(lag(s)))
	}
	gauge(c.consumedSeq, float64(s.ConsumedSeq))
	gauge(c.processedSeq, float64(s.ProcessedSeq))
	gauge(c.streamLastSeq, float64(s.StreamLastSeq))
	if s.Watermark != math.MinInt64 {
		gauge(c.watermark, float64(s.Watermark)/1e3)
	}
	for slot, b := range s.StateBytes {
		gauge(c.stateBytes, float64(b), strconv.Itoa(slot))
	}
	for _, st := range s.SubTopologies {
		counter(c.subIn, float64(st.RecordsIn), st.Name)
		counter(c.subOut, float64(st.RecordsOut), st.Name)
		if !st.LagUnknown {
			gauge(c.subLag, float64(st.StreamLastSeq-min(st.ProcessedSeq, st.StreamLastSeq)), st.Name)
		}
		gauge(c.subState, float64(st.StateBytes), st.Name)
		if st.Watermark != math.MinInt64 {
			gauge(c.subWm, float64(st.Watermark)/1e3, st.Name)
		}
	}

	if c.stages != nil {
		for _, st := range c.stages.StageStats() {
			counter(c.stageIn, float64(st.RecordsIn), st.SubTopology, st.Stage)
			counter(c.stageOut, float64(st.RecordsOut), st.SubTopology, st.Stage)
			counter(c.stageDead, float64(st.DeadLetters), st.SubTopology, st.Stage)
		}
	}

	if w := s.BrokerWait; w != nil {
		gauge(c.brokerWait, time.Since(w.Since).Seconds(), w.Reason, w.Stream)
	}
	counter(c.brokerResumes, float64(s.BrokerResumes))

	for _, g := range s.StateGrowth {
		gauge(c.stUnbounded, boolFloat(g.Unbounded), g.Stage)
		if g.Intervals >= 2 {
			gauge(c.stGrowth, g.BytesPerSecond, g.Stage)
		}
	}

	c.mu.Lock()
	c.observeLocked(s)
	for _, result := range []string{resultCompleted, resultFailed} {
		counter(c.checkpoints, float64(c.mu.checkpoints[result]), result)
	}
	for _, source := range sortedKeys(c.mu.restores) {
		counter(c.restores, float64(c.mu.restores[source]), source)
	}
	c.mu.Unlock()

	if ck, ok := lastCompleted(s.Checkpoints); ok {
		gauge(c.ckID, float64(ck.ID))
		if !ck.Time.IsZero() {
			gauge(c.ckTime, float64(ck.Time.UnixNano())/1e9)
		}
		gauge(c.ckSync, ck.SyncDuration.Seconds())
		gauge(c.ckAsync, ck.AsyncDuration.Seconds())
		gauge(c.ckUploaded, float64(ck.BytesUploaded))
		gauge(c.ckFullState, float64(ck.FullStateSize))
		gauge(c.ckFilesUp, float64(ck.FilesUploaded))
		gauge(c.ckFilesReused, float64(ck.FilesReused))
		gauge(c.ckChain, float64(ck.ChainLength))
		gauge(c.ckRetainedExcl, float64(ck.RetainedExclusive))
		gauge(c.ckRetainedShared, float64(ck.RetainedShared))
		gauge(c.ckPredic, ck.PredictedRestore.Seconds())
	}
	if l := s.Latency; l != nil && len(l.Counts) == len(l.Bounds)+1 {
		buckets := make(map[float64]uint64, len(l.Bounds))
		var cum uint64
		for i, b := range l.Bounds {
			cum += l.Counts[i]
			buckets[b] = cum
		}
		ch <- prometheus.MustNewConstHistogram(c.latency, cum+l.Counts[len(l.Bounds)], l.Sum.Seconds(), buckets)
	}
	if n := len(s.Restores); n > 0 {
		r := s.Restores[n-1]
		gauge(c.rsDuration, r.Duration.Seconds())
		gauge(c.rsLocal, float64(r.BytesLocal))
		gauge(c.rsDownloaded, float64(r.BytesDownloaded))
		gauge(c.rsFiles, float64(r.Files))
		gauge(c.rsRescaled, boolFloat(r.Rescaled))
		gauge(c.rsChain, float64(r.ChainLength))
		gauge(c.rsCheckpointID, float64(r.CheckpointID))
		gauge(c.rsRemote, float64(r.BytesRemote))
		if r.FullyLocal > 0 {
			gauge(c.rsFullyLocal, r.FullyLocal.Seconds())
		}
	}
	if sb := s.Standby; sb != nil {
		gauge(c.sbCheckpoints, float64(sb.CheckpointsBehind))
		gauge(c.sbBytes, float64(sb.BytesBehind))
		gauge(c.sbLastSynced, float64(sb.LastSyncedID))
	}
	if c.disk != nil {
		for _, u := range c.disk.get(time.Now()) {
			gauge(c.diskBytes, float64(u.bytes), u.component, u.slot)
		}
	}
	if c.memory != nil {
		for _, m := range c.memory.MemoryBudget() {
			gauge(c.memoryShare, float64(m.Bytes), m.Component)
		}
	}

	c.syncHist.Collect(ch)
	c.asyncHist.Collect(ch)
	c.restoreHist.Collect(ch)
}

// observeLocked counts and observes the history entries not seen before. Entries that
// left the bounded history are forgotten; they cannot come back.
func (c *collector) observeLocked(s Snapshot) {
	if len(s.Checkpoints) > 0 {
		seen := make(map[checkpointKey]struct{}, len(s.Checkpoints))
		for _, ck := range s.Checkpoints {
			k := checkpointKey{ck.ID, ck.Time.UnixNano()}
			seen[k] = struct{}{}
			if _, ok := c.mu.seenCheckpoints[k]; ok {
				continue
			}
			if ck.Failed {
				c.mu.checkpoints[resultFailed]++
				continue
			}
			c.mu.checkpoints[resultCompleted]++
			mode := ck.Mode
			if mode == "" {
				mode = "unknown"
			}
			c.syncHist.WithLabelValues(mode).Observe(ck.SyncDuration.Seconds())
			c.asyncHist.WithLabelValues(mode).Observe(ck.AsyncDuration.Seconds())
		}
		c.mu.seenCheckpoints = seen
	}
	if len(s.Restores) > 0 {
		seen := make(map[restoreKey]struct{}, len(s.Restores))
		for _, r := range s.Restores {
			k := restoreKey{r.CheckpointID, r.Time.UnixNano(), r.Source, r.ToSlots}
			seen[k] = struct{}{}
			if _, ok := c.mu.seenRestores[k]; ok {
				continue
			}
			source := r.Source
			if source == "" {
				source = "unknown"
			}
			c.mu.restores[source]++
			c.restoreHist.WithLabelValues(source).Observe(r.Duration.Seconds())
		}
		c.mu.seenRestores = seen
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// lastCompleted returns the newest checkpoint of the history that did not fail.
func lastCompleted(history []Checkpoint) (Checkpoint, bool) {
	for i := len(history) - 1; i >= 0; i-- {
		if !history[i].Failed {
			return history[i], true
		}
	}
	return Checkpoint{}, false
}

// DiskSource is a Source that knows its directories on disk: the collector then exports
// cairn_disk_allocated_bytes for each.
type DiskSource interface {
	DiskDirs() []DiskDir
}

// MemorySource is a Source with a memory budget: /metrics reports its
// division.
type MemorySource interface {
	MemoryBudget() []MemoryShare
}

// StageSource is a Source that counts records per stage: /metrics exports
// cairn_stage_records_in_total, cairn_stage_records_out_total and
// cairn_stage_records_dead_lettered_total for each stage, stateless and
// keyed, labelled with the stage and its sub-topology. StageStats is called
// once per scrape and must be cheap and safe for concurrent use.
type StageSource interface {
	StageStats() []StageStats
}

// StageStats are one stage's record counts since the process started.
type StageStats struct {
	// SubTopology names the sub-topology the stage runs in (the job's name
	// for the first, or for a job that is one chain).
	SubTopology string
	Stage       string
	Keyed       bool
	RecordsIn   uint64
	RecordsOut  uint64
	DeadLetters uint64
}

// MemoryShare is one part of a memory budget.
type MemoryShare struct {
	Component string
	Bytes     int64
}

// DiskDir is a directory measured under a component label. The component "state" is a
// folder of slot folders (slot-<i>): each is reported with its slot label.
type DiskDir struct {
	Component string
	Path      string
}

// diskInterval is how long a measurement of the directories is reused: a walk stats every
// file, and a scrape every second must not do that every second.
const diskInterval = 5 * time.Second

// diskUsage measures a DiskSource's directories, at most once per interval.
type diskUsage struct {
	src   DiskSource
	every time.Duration

	mu     sync.Mutex
	at     time.Time // of the last measurement; zero before the first
	values []diskValue
}

type diskValue struct {
	component, slot string
	bytes           int64
}

// get returns the last measurement, measuring again when it is older than the interval.
// Concurrent scrapes wait for one walk instead of each walking.
func (u *diskUsage) get(now time.Time) []diskValue {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.at.IsZero() || now.Sub(u.at) >= u.every {
		u.values = measureDisk(u.src.DiskDirs())
		u.at = now
	}
	return u.values
}

// measureDisk sums the allocated blocks (Stat_t.Blocks, 512-byte units) of the files under
// each directory, counting each inode once: a local checkpoint hard-links the live state's
// SSTs, and the disk holds them once. A missing directory measures 0; files that vanish
// during the walk (compactions, checkpoint retention) are skipped.
func measureDisk(dirs []DiskDir) []diskValue {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]struct{}{}
	var out []diskValue
	add := func(component, slot string, n int64) {
		for i := range out {
			if out[i].component == component && out[i].slot == slot {
				out[i].bytes += n
				return
			}
		}
		out = append(out, diskValue{component: component, slot: slot, bytes: n})
	}
	for _, d := range dirs {
		if d.Component != "state" {
			add(d.Component, "", 0)
		}
		_ = filepath.WalkDir(d.Path, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return fs.SkipDir // unreadable: measure the rest
			}
			if p == d.Path {
				return nil // the folder itself: its component's, not a slot's
			}
			slot := ""
			if d.Component == "state" {
				rel, _ := filepath.Rel(d.Path, p)
				first, _, _ := strings.Cut(rel, string(filepath.Separator))
				if n, ok := strings.CutPrefix(first, "slot-"); ok {
					if _, err := strconv.Atoi(n); err == nil {
						slot = n
					}
				}
				if e.IsDir() && slot != "" && !strings.Contains(rel, string(filepath.Separator)) {
					add(d.Component, slot, 0) // an empty slot still reports
				}
			}
			info, err := e.Info()
			if err != nil {
				return nil
			}
			dev, ino, ok := sysfile.ID(info)
			if !ok {
				if !e.IsDir() {
					add(d.Component, slot, info.Size())
				}
				return nil
			}
			key := inode{dev, ino}
			if _, dup := seen[key]; dup {
				return nil
			}
			seen[key] = struct{}{}
			add(d.Component, slot, sysfile.Allocated(info))
			return nil
		})
	}
	return out
}
