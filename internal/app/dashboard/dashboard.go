// Package dashboard is cairn's observability surface on the HTTP port: a Prometheus
// /metrics endpoint, a JSON snapshot, a self-contained dashboard page and a few
// token-protected actions. It reads everything through Source, so it holds no engine,
// checkpoint or recovery types and can be tested with a fake.
//
// The two numbers cairn is built around, checkpoint duration and restore time, are
// exported and drawn side by side, with the predicted restore time of every checkpoint
// next to the measured one.
package dashboard

import (
	"crypto/subtle"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Source is what the dashboard reads. The CLI implements it over the engine, the
// checkpoint writer and recovery results. Snapshot is called once per scrape and once per
// dashboard poll (every second per open page), possibly concurrently, so it must be cheap
// and safe for concurrent use.
type Source interface {
	Snapshot() Snapshot
}

// SubTopology is one sub-topology of a job graph: its records, its lag
// behind its input (the job's input, or the repartition stream before it),
// its watermark and its state.
type SubTopology struct {
	Name                               string
	Slots                              int
	RecordsIn, RecordsOut, DeadLetters uint64
	ProcessedSeq, StreamLastSeq        uint64
	// LagUnknown: the input stream's last sequence has not been read from
	// the server yet, so StreamLastSeq is only what was consumed and the
	// lag is not reported (a lag of 0 would say "caught up").
	LagUnknown bool
	Watermark  int64 // Unix ms; math.MinInt64 if none
	StateBytes uint64
	// GraphCheckpoint is the newest graph checkpoint committed by this
	// process and GraphPart this sub-topology's checkpoint in it (0: none
	// yet).
	GraphCheckpoint, GraphPart uint64
}

// Snapshot is the state of one job at one instant.
type Snapshot struct {
	Job       string
	Slots     int
	KeyGroups int
	// Delivery is the output delivery mode ("" when unknown), and
	// CheckpointInterval the checkpoint interval: with transactional
	// delivery an output is visible only when the checkpoint after it
	// commits, so the interval bounds visibility, and the dashboard shows
	// that bound.
	Delivery           string
	CheckpointInterval time.Duration

	RecordsIn      uint64
	RecordsOut     uint64
	DeadLetters    uint64
	OutputsSkipped uint64
	// RepeatsDropped: repartition messages a downstream dropped as a
	// repeat of an output it had read (a late copy from a member that
	// lost the key group).
	RepeatsDropped uint64
	// UpstreamMissing: outputs of an upstream key group that a
	// downstream's repartition messages jumped over (the stream lost
	// them, or the writer dead-lettered them after indexing).
	UpstreamMissing uint64

	// ConsumedSeq is the last input stream sequence read from the broker, ProcessedSeq the
	// last one fully processed, StreamLastSeq the last one in the stream. The consumer lag
	// is StreamLastSeq - ProcessedSeq.
	ConsumedSeq, ProcessedSeq, StreamLastSeq uint64
	// LagUnknown: as SubTopology.LagUnknown, for the job's input stream.
	LagUnknown bool

	// Watermark is the event-time watermark in Unix milliseconds, math.MinInt64 if none.
	Watermark int64

	// StateBytes is the size of the local state of each slot, indexed by slot.
	StateBytes []uint64

	// SubTopologies, for a job graph, has each sub-topology's own figures
	// (the fields above are the first one's); nil for a chain.
	SubTopologies []SubTopology `json:",omitempty"`
	// Stages are each stage's record counts, every sub-topology's, in
	// order (empty when the source does not count per stage).
	Stages []StageStats `json:",omitempty"`

	// Checkpoints is the history of finished checkpoint attempts (committed or failed),
	// oldest first, bounded by the caller (for example the last 500). An entry must not
	// change once it is in the history: the metrics observe each entry once.
	Checkpoints []Checkpoint

	// Restores holds the restores done by this process (usually none or one) and the
	// results of drills, if any, oldest first.
	Restores []Restore

	// Standby is the lag of a warm standby; nil unless this process is one.
	Standby *StandbyLag

	// Story is the job process's supervisor's account of failures and restores; nil
	// when the job is not supervised.
	Story *Story
	// Presenter is the supervisor's numbers for an audience (the presenter
	// view); nil when the job is not supervised.
	Presenter *Presenter
	// Series is the throughput and lag history the supervisor keeps, oldest
	// first (the page draws its charts from it after a reload); nil when the
	// source keeps none.
	Series []Sample

	// Drill is the JSON of the last drill result, if any. It is opaque here and shown as a
	// table.
	Drill json.RawMessage

	// StateGrowth is the unbounded-state detector's view of each stateful stage (issue
	// 14, item 6); nil when the source does not watch any.
	StateGrowth []StateGrowth `json:",omitempty"`

	// Advice is the checkpoint mode advisor's answer, one per
	// sub-topology with checkpoints; nil until there is one.
	Advice []Advice `json:",omitempty"`
	// Latency is the record latency (engine/latency.go): of the job, or of
	// a job graph's last sub-topology (from its repartition stream); nil
	// when unknown.
	Latency *Latency `json:",omitempty"`
	// BrokerWait is what the job waits for between two runs (a full
	// stream, the server back); nil while it runs.
	BrokerWait *BrokerWait `json:",omitempty"`
	// BrokerResumes counts the runs the job resumed in its process after
	// a broker fault.
	BrokerResumes int `json:",omitempty"`
}

// BrokerWait is a job waiting for its broker: why ("stream_full",
// "publish_lost"), the stream (empty: the account's limits, or not known),
// the error that stopped the run, and since when.
type BrokerWait struct {
	Reason, Stream, Detail string
	Since                  time.Time
}

// Checkpoint is one finished checkpoint attempt and the figures it recorded.
type Checkpoint struct {
	ID     uint64
	Mode   string // "full" or "incremental" (a savepoint may say "savepoint")
	Time   time.Time
	Failed bool
	Error  string

	SyncDuration  time.Duration
	AsyncDuration time.Duration

	BytesUploaded int64
	FullStateSize int64
	FilesUploaded int
	FilesReused   int
	ChainLength   int

	RetainedExclusive int64
	RetainedShared    int64

	// PredictedRestore is the restore time from the store predicted by the restore
	// model (recovery/model); 0 while it is calibrating.
	PredictedRestore time.Duration
	// Prediction is the prediction with its inputs ("4 objects, 15.3 MB at 8.1 MB/s
	// measured 3 min ago + ... = 2.1 s"), or why there is none ("calibrating (...)").
	Prediction string
	// Reason says why the checkpoint's mode was chosen for it ("" when by
	// default): the restore budget's decision.
	Reason string
}

// Restore is one restore (of this process or measured by a drill) and its figures.
type Restore struct {
	CheckpointID    uint64
	Mode            string
	Time            time.Time
	Duration        time.Duration
	BytesLocal      int64
	BytesDownloaded int64
	Files           int
	Rescaled        bool
	FromSlots       int
	ToSlots         int
	ChainLength     int
	Source          string // "store", "local", "standby" or "savepoint"
	// BytesMoved is what a rescaled restore scanned from old slots and
	// ingested (recovery.Result.BytesMoved).
	BytesMoved int64

	// CheckpointDuration is the restored checkpoint's own duration (sync + async), from
	// its manifest; 0 when unknown.
	CheckpointDuration time.Duration
	// PredictedRestore is the restore time predicted for this restore before it ran; 0
	// when the product had no prediction it believes (shown as "calibrating").
	PredictedRestore time.Duration
	// CaughtUp is the time from the failure that caused this restore (a kill) until the
	// consumer lag was back to its level before it; 0 while unknown or not measured.
	CaughtUp time.Duration
	// Online is true for an online restore: processing started with
	// BytesRemote still in the store, downloaded in the background.
	Online bool
	// BytesRemote is what is still read remotely (live; 0 once fully local).
	BytesRemote int64
	// FullyLocal is the time from the start of processing until the state
	// was fully local; 0 while downloading or for a restore that downloaded
	// first.
	FullyLocal time.Duration
}

// Story is what a supervisor of the job process (cairn demo) tells about it: the phase
// the process is in and the lines of its last restart, oldest first.
type Story struct {
	// Phase is a short word: "starting", "running", "restoring", "catching up", "stopping".
	Phase string
	// Progress is the running restore's progress from 0 to 1, or -1 when none.
	Progress float64
	Lines    []string
}

// StandbyLag is how far a warm standby is behind the checkpoints of its job.
type StandbyLag struct {
	CheckpointsBehind int
	BytesBehind       int64
	LastSyncedID      uint64
}

// Latency is the record latency histogram since the start (Counts[i]: at most
// Bounds[i] seconds; the last count is above the last bound) and its
// quantiles over the last 10 s (0 when nothing was processed then).
type Latency struct {
	Bounds   []float64
	Counts   []uint64
	Sum      time.Duration
	P50, P99 float64
}

// StateGrowth is the unbounded-state detector's view of one stateful stage: its state's
// fitted growth against the records its sub-topology reads (the proxy for keys written),
// and whether the state grows without bound.
type StateGrowth struct {
	Stage       string
	SubTopology string
	// Unbounded is the flag: the state rose over many intervals while the write rate
	// stayed flat. Since is when it was raised; Message says it ("state of stage count
	// grows without bound: missing TTL? ..."), "" when not flagged.
	Unbounded bool
	Since     time.Time
	Message   string
	// BytesPerSecond is the fitted growth of the stage's state (negative: shrinking) and
	// RecordsPerSecond the mean input rate, over Intervals samples (one per checkpoint
	// interval); both are 0 below two samples.
	BytesPerSecond   float64
	RecordsPerSecond float64
	Intervals        int
	StateBytes       uint64
}

// Advice is the checkpoint mode advisor's answer for one sub-topology (the job, for a
// chain): whether incremental checkpoints buy anything, from measured numbers only.
type Advice struct {
	Name string
	// Recommend is "incremental", "full", "either" or "unknown" (a mode or a restore term
	// not measured yet: Text says what and how to measure it).
	Recommend string
	Text      string
	// The modes' figures: p50 checkpoint duration (sync + async) and bytes uploaded over
	// the retained checkpoints of each, and the predicted restore from the store of the
	// newest of each; 0 when not measured, or calibrating.
	IncrementalTook, FullTook         time.Duration
	IncrementalUploaded, FullUploaded int64
	IncrementalRestore, FullRestore   time.Duration
	StateBytes                        int64
}

// Options configures Handler.
type Options struct {
	// Token, when set, is required as "Authorization: Bearer TOKEN" by every action.
	Token string

	// Actions are served as POST /api/action/{name}, for example "checkpoint" and
	// "savepoint". Each returns an HTTP status and a short text for the user.
	Actions map[string]func(r *http.Request) (int, string)
}

// Handler serves the dashboard page at "/", Prometheus metrics at "/metrics", the JSON
// snapshot at "/api/snapshot" and the actions at "POST /api/action/{name}". The metrics
// use a registry of their own holding NewCollector(src) and the Go runtime and process
// collectors.
func Handler(src Source, o Options) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		NewCollector(src),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	names := make([]string, 0, len(o.Actions))
	for name := range o.Actions {
		names = append(names, name)
	}
	slices.Sort(names)

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", servePage)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /api/snapshot", func(w http.ResponseWriter, _ *http.Request) {
		v := newAPISnapshot(src.Snapshot(), time.Now())
		v.Actions = names
		v.TokenRequired = o.Token != ""
		b, err := json.Marshal(v)
		if err != nil {
			http.Error(w, "dashboard: encode snapshot: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(b)
	})
	mux.HandleFunc("POST /api/action/{name}", func(w http.ResponseWriter, r *http.Request) {
		serveAction(w, r, o)
	})
	return mux
}

// ActionHandler serves POST /api/action/{name} from actions, with the
// checks of the dashboard's own actions (the token, localhost without one,
// same origin): for a server that answers some actions itself.
func ActionHandler(token string, actions map[string]func(*http.Request) (int, string)) http.Handler {
	mux := http.NewServeMux()
	o := Options{Token: token, Actions: actions}
	mux.HandleFunc("POST /api/action/{name}", func(w http.ResponseWriter, r *http.Request) {
		serveAction(w, r, o)
	})
	return mux
}

func serveAction(w http.ResponseWriter, r *http.Request, o Options) {
	w.Header().Set("Cache-Control", "no-store")
	if o.Token != "" {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(o.Token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="cairn"`)
			http.Error(w, "dashboard: this action needs the token given with --http-token, as \"Authorization: Bearer TOKEN\"", http.StatusUnauthorized)
			return
		}
	} else if !loopbackHost(r.Host) {
		// Without a token the port is loopback-only (Listen). A request naming another
		// host reached it through DNS rebinding or a proxy: refuse to act on it.
		http.Error(w, "dashboard: actions without --http-token are accepted only for localhost", http.StatusForbidden)
		return
	}
	// A cross-site page can send a simple POST to localhost; browsers mark it with Origin.
	if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r.Host) {
		http.Error(w, "dashboard: cross-origin action refused", http.StatusForbidden)
		return
	}
	act, ok := o.Actions[r.PathValue("name")]
	if !ok {
		http.Error(w, "dashboard: no action "+r.PathValue("name"), http.StatusNotFound)
		return
	}
	code, msg := act(r)
	if code == 0 {
		code = http.StatusOK
	}
	ctype := "text/plain; charset=utf-8"
	if strings.HasPrefix(msg, "{") && WantsJSON(r) {
		ctype = "application/json"
	}
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(code)
	_, _ = io.WriteString(w, msg)
	if !strings.HasSuffix(msg, "\n") {
		_, _ = io.WriteString(w, "\n")
	}
}

func sameOrigin(origin, host string) bool {
	_, rest, ok := strings.Cut(origin, "://")
	return ok && strings.EqualFold(rest, host)
}

func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// apiSnapshot is the wire form of Snapshot for the page: explicit units, times in Unix
// milliseconds, durations in seconds.
type apiSnapshot struct {
	Job           string          `json:"job"`
	Slots         int             `json:"slots"`
	KeyGroups     int             `json:"key_groups"`
	Delivery      string          `json:"delivery,omitempty"`
	Interval      float64         `json:"checkpoint_interval_seconds,omitempty"`
	NowMs         int64           `json:"now_ms"`
	RecordsIn     uint64          `json:"records_in"`
	RecordsOut    uint64          `json:"records_out"`
	DeadLetters   uint64          `json:"dead_letters"`
	Skipped       uint64          `json:"outputs_skipped"`
	Repeats       uint64          `json:"repeats_dropped,omitempty"`
	Missing       uint64          `json:"upstream_outputs_missing,omitempty"`
	ConsumedSeq   uint64          `json:"consumed_seq"`
	ProcessedSeq  uint64          `json:"processed_seq"`
	StreamLastSeq uint64          `json:"stream_last_seq"`
	Lag           uint64          `json:"lag"`
	WatermarkMs   *int64          `json:"watermark_ms"`
	StateBytes    []uint64        `json:"state_bytes"`
	Checkpoints   []apiCheckpoint `json:"checkpoints"`
	Restores      []apiRestore    `json:"restores"`
	Standby       *apiStandby     `json:"standby"`
	Story         *apiStory       `json:"story,omitempty"`
	Presenter     *Presenter      `json:"presenter,omitempty"`
	Series        []Sample        `json:"series,omitempty"`
	Drill         json.RawMessage `json:"drill,omitempty"`
	Actions       []string        `json:"actions"`
	TokenRequired bool            `json:"token_required"`

	// A job graph's sub-topologies (lag: of the stream each reads) and every
	// stage's records.
	SubTopologies []apiSubTopology `json:"sub_topologies,omitempty"`
	Stages        []apiStage       `json:"stages,omitempty"`

	// The unbounded-state detector and the checkpoint mode advisor.
	StateGrowth []apiStateGrowth `json:"state_growth,omitempty"`
	Latency     *apiLatency      `json:"latency,omitempty"`
	Advice      []apiAdvice      `json:"advice,omitempty"`

	BrokerWait *apiBrokerWait `json:"broker_wait,omitempty"`
}

type apiBrokerWait struct {
	Reason  string  `json:"reason"`
	Stream  string  `json:"stream,omitempty"`
	Detail  string  `json:"detail"`
	Seconds float64 `json:"seconds"`
}

type apiCheckpoint struct {
	ID                uint64  `json:"id"`
	Mode              string  `json:"mode"`
	TimeMs            int64   `json:"time_ms"`
	Failed            bool    `json:"failed"`
	Error             string  `json:"error,omitempty"`
	Sync              float64 `json:"sync_seconds"`
	Async             float64 `json:"async_seconds"`
	BytesUploaded     int64   `json:"bytes_uploaded"`
	FullState         int64   `json:"full_state_bytes"`
	FilesUploaded     int     `json:"files_uploaded"`
	FilesReused       int     `json:"files_reused"`
	ChainLength       int     `json:"chain_length"`
	RetainedExclusive int64   `json:"retained_exclusive_bytes"`
	RetainedShared    int64   `json:"retained_shared_bytes"`
	PredictedRestore  float64 `json:"predicted_restore_seconds"`
	Prediction        string  `json:"prediction,omitempty"`
	Reason            string  `json:"reason,omitempty"`
}

type apiRestore struct {
	CheckpointID    uint64  `json:"checkpoint_id"`
	Mode            string  `json:"mode"`
	TimeMs          int64   `json:"time_ms"`
	Duration        float64 `json:"duration_seconds"`
	BytesLocal      int64   `json:"bytes_local"`
	BytesDownloaded int64   `json:"bytes_downloaded"`
	Files           int     `json:"files"`
	Rescaled        bool    `json:"rescaled"`
	FromSlots       int     `json:"from_slots"`
	ToSlots         int     `json:"to_slots"`
	ChainLength     int     `json:"chain_length"`
	Source          string  `json:"source"`
	// Checkpoint, Predicted and CaughtUp are null when unknown.
	Checkpoint *float64 `json:"checkpoint_duration_seconds"`
	Predicted  *float64 `json:"predicted_restore_seconds"`
	CaughtUp   *float64 `json:"caught_up_seconds"`
	// Online restores: the bytes still remote (live) and the time to fully
	// local (null while downloading).
	Online      bool     `json:"online,omitempty"`
	BytesRemote int64    `json:"bytes_remote"`
	FullyLocal  *float64 `json:"fully_local_seconds"`
	// BytesMoved: a rescale's key groups scanned from old slots and
	// ingested (the restore model's move term).
	BytesMoved int64 `json:"bytes_moved,omitempty"`
}

type apiSubTopology struct {
	Name        string `json:"name"`
	Slots       int    `json:"slots"`
	RecordsIn   uint64 `json:"records_in"`
	RecordsOut  uint64 `json:"records_out"`
	DeadLetters uint64 `json:"dead_letters"`
	Lag         uint64 `json:"lag"`
	WatermarkMs *int64 `json:"watermark_ms"`
	StateBytes  uint64 `json:"state_bytes"`
	// GraphCheckpoint and GraphPart: the newest graph checkpoint and this
	// sub-topology's checkpoint in it (omitted before the first).
	GraphCheckpoint uint64 `json:"graph_checkpoint,omitempty"`
	GraphPart       uint64 `json:"graph_part,omitempty"`
}

type apiStage struct {
	SubTopology string `json:"sub_topology"`
	Stage       string `json:"stage"`
	Keyed       bool   `json:"keyed"`
	RecordsIn   uint64 `json:"records_in"`
	RecordsOut  uint64 `json:"records_out"`
	DeadLetters uint64 `json:"dead_letters"`
}

type apiStateGrowth struct {
	Stage            string  `json:"stage"`
	SubTopology      string  `json:"sub_topology"`
	Unbounded        bool    `json:"unbounded"`
	SinceMs          int64   `json:"since_ms,omitempty"`
	Message          string  `json:"message,omitempty"`
	BytesPerSecond   float64 `json:"growth_bytes_per_second"`
	RecordsPerSecond float64 `json:"records_per_second"`
	Intervals        int     `json:"intervals"`
	StateBytes       uint64  `json:"state_bytes"`
}

type apiAdvice struct {
	Name      string `json:"name"`
	Recommend string `json:"recommend"`
	Text      string `json:"text"`
	// The figures are null when not measured (or calibrating).
	IncrementalTook     *float64 `json:"incremental_checkpoint_seconds"`
	FullTook            *float64 `json:"full_checkpoint_seconds"`
	IncrementalUploaded int64    `json:"incremental_uploaded_bytes"`
	FullUploaded        int64    `json:"full_uploaded_bytes"`
	IncrementalRestore  *float64 `json:"incremental_restore_seconds"`
	FullRestore         *float64 `json:"full_restore_seconds"`
	StateBytes          int64    `json:"state_bytes"`
}

type apiLatency struct {
	Bounds []float64 `json:"bounds_seconds"`
	Counts []uint64  `json:"counts"`
	Sum    float64   `json:"sum_seconds"`
	P50    float64   `json:"p50_seconds"`
	P99    float64   `json:"p99_seconds"`
}

type apiStory struct {
	Phase    string   `json:"phase"`
	Progress float64  `json:"progress"`
	Lines    []string `json:"lines"`
}

type apiStandby struct {
	CheckpointsBehind int    `json:"checkpoints_behind"`
	BytesBehind       int64  `json:"bytes_behind"`
	LastSyncedID      uint64 `json:"last_synced_id"`
}

func newAPISnapshot(s Snapshot, now time.Time) apiSnapshot {
	v := apiSnapshot{
		Job: s.Job, Slots: s.Slots, KeyGroups: s.KeyGroups, NowMs: now.UnixMilli(),
		Delivery: s.Delivery, Interval: s.CheckpointInterval.Seconds(),
		RecordsIn: s.RecordsIn, RecordsOut: s.RecordsOut, DeadLetters: s.DeadLetters, Skipped: s.OutputsSkipped, Repeats: s.RepeatsDropped, Missing: s.UpstreamMissing,
		ConsumedSeq: s.ConsumedSeq, ProcessedSeq: s.ProcessedSeq, StreamLastSeq: s.StreamLastSeq,
		Lag:         lag(s),
		StateBytes:  s.StateBytes,
		Checkpoints: make([]apiCheckpoint, 0, len(s.Checkpoints)),
		Restores:    make([]apiRestore, 0, len(s.Restores)),
		Actions:     []string{},
	}
	if v.StateBytes == nil {
		v.StateBytes = []uint64{}
	}
	if s.Watermark != math.MinInt64 {
		wm := s.Watermark
		v.WatermarkMs = &wm
	}
	for _, c := range s.Checkpoints {
		v.Checkpoints = append(v.Checkpoints, apiCheckpoint{
			ID: c.ID, Mode: c.Mode, TimeMs: unixMs(c.Time), Failed: c.Failed, Error: redact(c.Error),
			Sync: c.SyncDuration.Seconds(), Async: c.AsyncDuration.Seconds(),
			BytesUploaded: c.BytesUploaded, FullState: c.FullStateSize,
			FilesUploaded: c.FilesUploaded, FilesReused: c.FilesReused, ChainLength: c.ChainLength,
			RetainedExclusive: c.RetainedExclusive, RetainedShared: c.RetainedShared,
			PredictedRestore: c.PredictedRestore.Seconds(), Prediction: c.Prediction, Reason: c.Reason,
		})
	}
	for _, r := range s.Restores {
		v.Restores = append(v.Restores, apiRestore{
			CheckpointID: r.CheckpointID, Mode: r.Mode, TimeMs: unixMs(r.Time), Duration: r.Duration.Seconds(),
			BytesLocal: r.BytesLocal, BytesDownloaded: r.BytesDownloaded, Files: r.Files,
			Rescaled: r.Rescaled, FromSlots: r.FromSlots, ToSlots: r.ToSlots,
			ChainLength: r.ChainLength, Source: r.Source,
			Checkpoint: seconds(r.CheckpointDuration), Predicted: seconds(r.PredictedRestore), CaughtUp: seconds(r.CaughtUp),
			Online: r.Online, BytesRemote: r.BytesRemote, FullyLocal: seconds(r.FullyLocal), BytesMoved: r.BytesMoved,
		})
	}
	if l := s.Latency; l != nil {
		v.Latency = &apiLatency{Bounds: l.Bounds, Counts: l.Counts, Sum: l.Sum.Seconds(), P50: l.P50, P99: l.P99}
	}
	if st := s.Story; st != nil {
		v.Story = &apiStory{Phase: st.Phase, Progress: st.Progress, Lines: append([]string{}, st.Lines...)}
	}
	v.Presenter, v.Series = s.Presenter, s.Series
	if s.Standby != nil {
		v.Standby = &apiStandby{s.Standby.CheckpointsBehind, s.Standby.BytesBehind, s.Standby.LastSyncedID}
	}
	if w := s.BrokerWait; w != nil {
		v.BrokerWait = &apiBrokerWait{Reason: w.Reason, Stream: w.Stream, Detail: redact(w.Detail), Seconds: now.Sub(w.Since).Seconds()}
	}
	// An invalid document would make the whole snapshot fail to encode; drop it instead.
	if len(s.Drill) > 0 && json.Valid(s.Drill) {
		v.Drill = s.Drill
	}
	for _, st := range s.SubTopologies {
		a := apiSubTopology{Name: st.Name, Slots: st.Slots, RecordsIn: st.RecordsIn, RecordsOut: st.RecordsOut,
			DeadLetters: st.DeadLetters, StateBytes: st.StateBytes, GraphCheckpoint: st.GraphCheckpoint, GraphPart: st.GraphPart}
		if st.StreamLastSeq > st.ProcessedSeq {
			a.Lag = st.StreamLastSeq - st.ProcessedSeq
		}
		if st.Watermark != math.MinInt64 {
			wm := st.Watermark
			a.WatermarkMs = &wm
		}
		v.SubTopologies = append(v.SubTopologies, a)
	}
	for _, st := range s.Stages {
		v.Stages = append(v.Stages, apiStage(st))
	}
	for _, g := range s.StateGrowth {
		v.StateGrowth = append(v.StateGrowth, apiStateGrowth{Stage: g.Stage, SubTopology: g.SubTopology, Unbounded: g.Unbounded,
			SinceMs: unixMs(g.Since), Message: g.Message, BytesPerSecond: g.BytesPerSecond, RecordsPerSecond: g.RecordsPerSecond,
			Intervals: g.Intervals, StateBytes: g.StateBytes})
	}
	for _, a := range s.Advice {
		v.Advice = append(v.Advice, apiAdvice{Name: a.Name, Recommend: a.Recommend, Text: a.Text,
			IncrementalTook: seconds(a.IncrementalTook), FullTook: seconds(a.FullTook),
			IncrementalUploaded: a.IncrementalUploaded, FullUploaded: a.FullUploaded,
			IncrementalRestore: seconds(a.IncrementalRestore), FullRestore: seconds(a.FullRestore), StateBytes: a.StateBytes})
	}
	return v
}

// lag is the consumer lag in messages, never negative: the stream's last sequence is read
// at another instant than the processed one.
func lag(s Snapshot) uint64 {
	if s.StreamLastSeq <= s.ProcessedSeq {
		return 0
	}
	return s.StreamLastSeq - s.ProcessedSeq
}

// seconds is d in seconds, nil for 0 (unknown).
func seconds(d time.Duration) *float64 {
	if d <= 0 {
		return nil
	}
	s := d.Seconds()
	return &s
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// userinfo matches the credentials part of a URL ("s3://key:secret@host"), which an
// error from a store may carry; secrets never reach the dashboard.
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@`)

func redact(s string) string { return userinfo.ReplaceAllString(s, "${1}REDACTED@") }

// WantsJSON reports whether a control request asked for a JSON answer
// (Accept: application/json): programs (the drill, the demo) read the
// answer's fields instead of parsing a sentence.
func WantsJSON(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "application/json")
}
