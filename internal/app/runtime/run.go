package runtime

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime/online"
	"cairn/internal/base/datadir"
	"cairn/internal/base/natsembed"
	"cairn/nexmark/source"
	"cairn/recovery"
	"cairn/recovery/model"
	"cairn/state"
	"cairn/wasm"
)

// Options are the run-time choices that are not job-file fields.
type Options struct {
	// Assignment is the parts of the job this process runs (nil: all of
	// it, Plan.All).
	Assignment Assignment
	// Restore: "latest" (default), a checkpoint id, "savepoint:NAME" or "none".
	Restore string
	// RestoreSub overrides Restore for sub-topology k of a job graph (a
	// group member restoring a group savepoint's part for some of what
	// it runs, and the newest checkpoint for the rest).
	RestoreSub map[int]string
	// StandbyCache is a standby's cache directory to restore from first.
	StandbyCache string
	// SavepointOnStop, when set, makes the graceful stop's checkpoint a savepoint.
	SavepointOnStop string
	// AllowModuleChange restores a checkpoint that a stage's module (a
	// file, not a builtin) has changed since; without it only a savepoint
	// restore allows that.
	AllowModuleChange bool
	// Progress receives restore progress (nil: log lines).
	Progress func(recovery.Progress)
	// ProgressEvery is the period of restore progress (default 2s).
	ProgressEvery time.Duration
	// Broker, when set, is the log the job runs on instead of NATS (cairn
	// test runs jobs on an engine.MemLog).
	Broker engine.Broker
	// PublishGuard is engine.Config.PublishGuard (a group member's lease
	// check).
	PublishGuard func() error
	// FenceEpochs is engine.Config.FenceEpoch of sub-topology k (a group
	// member's epoch of each sub-topology it runs); absent: not fenced.
	FenceEpochs map[int]uint64
	// OnReplay is engine.Config.OnReplay.
	OnReplay func(kg int, idx uint64, key, value []byte, evTime int64)
	// RestoreMode overrides the job's restore.mode ("" keeps it).
	RestoreMode string
	// WrapStore, when set, wraps the checkpoint store the job writes and
	// restores through (the demo puts it behind a simulated network link).
	WrapStore func(checkpoint.Store) checkpoint.Store
	// StopTimeout bounds a graceful stop (0: DefaultStopTimeout).
	StopTimeout time.Duration
	// NATSUnreachable stops the job once its NATS server has been
	// unreachable this long (0: DefaultNATSUnreachable, negative: never).
	NATSUnreachable time.Duration
	// AllowInputGap goes on when records of an input stream are gone
	// before the job read them (purged, or removed by the stream's
	// limits): the job reads on from the stream's first message instead
	// of stopping with ErrInputGap.
	AllowInputGap bool
}

// Running is a started job: its NATS connection (and embedded server) and
// its engine, ready to Run.
type Running struct {
	// graph commits a job graph's graph checkpoints (nil for a chain, or
	// without checkpoints); set on the first sub-topology only.
	graph *graphCheckpoints
	// loops are the Running's background loops (a remote purge's), ended
	// first thing in Close.
	loops   []loop
	Job     *job.Job
	Engine  *engine.Engine
	NC      *nats.Conn
	NATSURL string
	Hashes  map[string]string
	// StateVersions are the state versions the keyed stages' modules
	// declare (those other than 0).
	StateVersions map[string]int
	StartSeq      uint64
	Restored      *recovery.Result // nil when the job started empty
	// DrillReport is a drill.json whose results the dashboard shows.
	DrillReport string
	Writer      *checkpoint.Writer // nil without checkpoints
	Store       checkpoint.Store   // nil without checkpoints

	// Downstream are the other sub-topologies of a job graph, in order
	// (this Running is the first); Run and Close cover them.
	Downstream []*Running

	embedded *natsembed.Server
	rt       *wasm.Runtime
	borrowed bool // NC and rt belong to the first sub-topology's Running
	// events are the checkpoint writer's, for the dashboard's observer.
	events *eventHub
	// committer is the checkpoint committer (nil without checkpoints).
	committer *committer
	// model is the job's restore model, shared by the committer (uploads
	// calibrate it; the restore budget asks it) and the dashboard (nil
	// without checkpoints).
	model *model.Model
	// online is an online restore's background download (nil when the
	// state was restored whole, or not at all).
	online *online.Download
	// gates must pass before the engine runs (a table to load first).
	gates []func(context.Context) error
	// budget is the job's memory budget, divided (zero: none).
	budget memoryBudget
	// link follows the NATS connection (shared by a graph's
	// sub-topologies; nil on another broker); stopTimeout and
	// unreachable are Options'.
	link        *natsLink
	stopTimeout time.Duration
	unreachable time.Duration
	log         *slog.Logger
	// abandoned: a stop gave up on engines that did not end; Close then
	// closes only the connection and the embedded server.
	abandoned atomic.Bool
	// allowInputGap is Options'.
	allowInputGap bool
	// waits is what the job waits for between runs (RunResuming; nil
	// outside it).
	waits *brokerWaits

	// compiling is the stages' compile beside the start (compilebeside.go).
	compiling *compiling
}

// Start checks the data directory, reads and compiles the modules, connects
// (starting the embedded server when asked), restores state (the latest
// checkpoint by default) and builds the engine. Every refusal happens here,
// before any input is read; the local ones (data directory, module files
// and pins) come before NATS starts or anything is restored. The modules
// compile beside the connect and the restore (compilebeside.go).
func Start(ctx context.Context, j *job.Job, ro Options, log *slog.Logger) (*Running, error) {
	p, err := NewPlan(j)
	if err != nil {
		return nil, err
	}
	var local []int
	if ro.Assignment != nil {
		if err := p.Check(ro.Assignment); err != nil {
			return nil, err
		}
		if !p.Whole(ro.Assignment) {
			if local, err = p.wholeSubs(ro.Assignment); err != nil {
				return nil, err
			}
		}
	}
	p.mb.apply(log)
	if len(p.Subs) > 1 {
		return startGraph(ctx, j, p.Subs, p.mb, ro, log, local)
	}
	if r, ok := ro.RestoreSub[0]; ok {
		ro.Restore = r
	}
	return startSub(ctx, p.SubJob(0), ro, log, nil, subPos{n: 1, sub: p.Subs[0], budget: p.mb})
}

// startSub starts one sub-topology of a job (the whole job when it has one).
// shared, for the sub-topologies after the first, lends its NATS connection
// and WebAssembly runtime.
func startSub(ctx context.Context, j *job.Job, ro Options, log *slog.Logger, shared *Running, pos subPos) (_ *Running, err error) {
	r := &Running{Job: j, StartSeq: 1, events: &eventHub{}}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	if err := CheckDataDir(j.DataDir); err != nil {
		return nil, err
	}
	r.stopTimeout, r.unreachable, r.log, r.allowInputGap = ro.StopTimeout, ro.NATSUnreachable, log, ro.AllowInputGap
	if r.unreachable == 0 {
		r.unreachable = DefaultNATSUnreachable
	}
	if shared != nil {
		r.rt, r.NC, r.NATSURL, r.borrowed, r.link = shared.rt, shared.NC, shared.NATSURL, true, shared.link
	} else if r.rt, err = wasm.NewRuntime(ctx, wasm.RuntimeConfig{CacheDir: compileCacheDir(j.DataDir), MaxModuleBytes: MaxModuleBytes}); err != nil {
		return nil, err
	}
	r.budget = pos.budget
	srcs, hashes, err := readStages(j, pos.budget, log)
	if err != nil {
		return nil, err
	}
	r.Hashes = hashes
	r.compiling = compileBeside(ctx, r.rt, j, srcs, hashes) // compilebeside.go
	defer func() {
		// Every return waits for the compile (it uses r.rt, which Close
		// closes), and an invalid module is the error whatever else failed.
		if cerr := r.compiling.wait(); cerr != nil {
			err = cerr
		}
	}()
	// A generated input with a discard output needs no server at all.
	standalone := j.Input.Nexmark != nil && j.Output.Discard
	if ro.Broker == nil && shared == nil && !standalone {
		r.NATSURL = j.NATS
		if j.NATS == "embedded" {
			if r.embedded, err = natsembed.Start(natsembed.Options{Dir: j.DataDir, JSMemory: pos.budget.NATS, Hint: "the embedded server keeps its streams under the data directory; fix that directory or choose another with --data or data_dir"}); err != nil {
				return nil, err
			}
			r.NATSURL = r.embedded.URL()
		}
		r.link = newNATSLink(r.NATSURL, log)
		if r.NC, err = connect(r.NATSURL, j, log, r.link.options()...); err != nil {
			return nil, err
		}
	}
	cfg := engineConfig(j, nil, log)
	cfg.SlotCacheBytes, cfg.SlotMemTableBytes = pos.budget.stateOptions()
	cfg.OnReplay = ro.OnReplay
	cfg.PublishGuard = ro.PublishGuard
	cfg.FenceEpoch = ro.FenceEpochs[pos.k]
	cfg.Repartition = pos.sub.Targets[0].Feeds >= 0
	cfg.UpstreamWatermarks = pos.sub.Input == ""
	cfg.UpstreamSides = pos.sub.Sides
	if j.Checkpoint != nil {
		r.model = model.Load(j.DataDir)
		if cfg.Checkpoint, r.Writer, r.Store, r.committer, err = setupCheckpoints(ctx, j, hashes, r.events.listener(), r.model, ro.WrapStore, log); err != nil {
			return nil, err
		}
		if ro.SavepointOnStop != "" {
			if err := checkpoint.ValidateSavepointName(ro.SavepointOnStop); err != nil {
				return nil, err
			}
			cfg.Checkpoint.OnStop = engine.CheckpointRequest{Savepoint: ro.SavepointOnStop}
		}
	} else if ro.SavepointOnStop != "" {
		return nil, &job.Error{Field: "checkpoint", Reason: "--savepoint-on-stop needs a checkpoint store"}
	}
	if err := r.restore(ctx, j, ro, log); err != nil {
		return nil, err
	}
	if err := r.compiled(); err != nil {
		return nil, err
	}
	cfg.Stages = r.compiling.stages
	if r.committer != nil {
		r.committer.stateVersions = r.StateVersions
	}
	cfg.StartSeq = r.StartSeq
	if r.Restored != nil && r.Restored.Origin == nil {
		// A state a tool wrote (`cairn state import|migrate`) may hold
		// timers earlier than the bounds it carries over: the slots walk.
		cfg.RestoredCheckpoint = r.Restored.ID
	}
	broker := ro.Broker
	if broker == nil && (j.Input.Nexmark != nil || j.Output.Discard) {
		if broker, err = source.ForJob(cfg, r.NC, j.Input.Nexmark, j.Output.Discard); err != nil {
			return nil, err
		}
	}
	if broker != nil {
		r.Engine, err = engine.NewWithBroker(cfg, broker)
	} else {
		r.Engine, err = engine.New(cfg, r.NC)
	}
	if err != nil {
		return nil, err
	}
	if r.Writer != nil {
		next := r.Writer.NextID()
		if r.Restored != nil && r.Restored.ID >= next {
			next = r.Restored.ID + 1
		}
		r.Engine.SetNextCheckpointID(next)
	}
	return r, nil
}

// restore brings DataDir/state to the chosen checkpoint, or empties it: the
// input restarts from sequence 1 when there is nothing to restore, so stale
// local state must not be counted twice.
func (r *Running) restore(ctx context.Context, j *job.Job, ro Options, log *slog.Logger) (err error) {
	spec := ro.Restore
	if spec == "" {
		spec = "latest"
	}
	var m *checkpoint.Manifest
	var selectErr error
	if r.Store != nil {
		if w := r.Writer; w != nil && spec == "latest" && w.Intact() && (w.Latest() == nil || w.Latest().Job == j.Name) {
			// The writer has just read every manifest: reading them again
			// would cost a listing and a manifest's read in round trips to
			// the store, on every start.
			m = w.Latest()
		} else {
			m, selectErr = recovery.Select(ctx, r.Store, j.Name, spec)
		}
		if selectErr != nil && !(j.Restore.Fallback == "previous" && spec == "latest" && recovery.IsBroken(selectErr)) {
			return fmt.Errorf("restore %s: %w", spec, selectErr)
		}
		if m != nil && r.compiling.ready() {
			if err := r.checkStateVersions(j, spec, m); err != nil {
				return err
			}
		} else if m != nil {
			// Checked once the modules have compiled, after the restore
			// that runs meanwhile (compilebeside.go).
			defer func() {
				if err == nil {
					err = r.checkStateVersions(j, spec, m)
				}
			}()
		}
		if m != nil && !ro.AllowModuleChange && !strings.HasPrefix(spec, "savepoint:") {
			if err := moduleChanged(j, m, r.Hashes); err != nil {
				return err
			}
		}
	} else if spec != "latest" && spec != "none" {
		return &job.Error{Field: "checkpoint", Reason: fmt.Sprintf("--restore %s needs a checkpoint store", spec)}
	}
	if m == nil && selectErr == nil {
		if r.Store != nil {
			u, _ := StoreURL(j)
			if err := checkFreshStart(j, u, spec == "none"); err != nil {
				return err
			}
		}
		stateDir := datadir.State(j.DataDir)
		if _, err := os.Stat(stateDir); err == nil {
			log.Warn("no checkpoint to restore: starting from an empty state and the first input message", "removed", stateDir)
		}
		if err := recovery.CleanDataDir(j.DataDir); err != nil {
			return err
		}
		return os.RemoveAll(stateDir)
	}
	progress := ro.Progress
	if progress == nil {
		progress = func(p recovery.Progress) {
			log.Info("restore progress", "phase", p.Phase, "bytes_done", p.BytesDone, "bytes_total", p.BytesTotal, "files_done", p.FilesDone, "files_total", p.FilesTotal)
		}
	}
	opts := recovery.Options{
		Store:         r.Store,
		Job:           j.Name,
		KeyGroups:     j.KeyGroups,
		SourceStream:  j.Input.Stream,
		Slots:         j.Slots,
		DataDir:       j.DataDir,
		LocalDir:      datadir.Checkpoints(j.DataDir),
		CacheDir:      ro.StandbyCache,
		Progress:      progress,
		ProgressEvery: cmp.Or(ro.ProgressEvery, 2*time.Second),
		Logger:        log,
		Online:        cmp.Or(ro.RestoreMode, j.Restore.Mode) == "online",
	}
	if f := online.ReadFailure(j.DataDir, log); f != nil && opts.Online && m != nil && f.Checkpoint == m.ID {
		log.Warn("online restore: the last online restore of this checkpoint found it broken; restoring by download, which verifies every file first",
			"checkpoint", f.Checkpoint, "cause", f.Reason, "at", f.Time)
		opts.Online = false
	}
	var res *recovery.Result
	if selectErr != nil { // the newest manifest itself is broken
		res, err = recovery.RestorePrevious(ctx, math.MaxUint64, selectErr, opts)
	} else if res, err = recovery.Restore(ctx, m, opts); err != nil && j.Restore.Fallback == "previous" && spec == "latest" && recovery.IsBroken(err) {
		res, err = recovery.RestorePrevious(ctx, m.ID, err, opts)
	}
	if err != nil {
		return err
	}
	r.Restored = res
	r.StartSeq = res.SourceSeq + 1
	noteRestoredObjects(r.Writer, res, log)
	if res.Remote == nil {
		online.ClearFailure(j.DataDir, log) // restored whole: verified
	}
	if res.OnlineRefused != "" {
		log.Info("online restore does not apply; the state was downloaded first", "checkpoint", res.ID, "reason", res.OnlineRefused)
	}
	if res.Remote != nil {
		var rate int64
		if j.Restore.DownloadRate != "" {
			rate, _ = job.ParseBytes(j.Restore.DownloadRate) // validated with the job
		}
		state.SetPrefetch(map[string]state.PrefetchMode{"on": state.PrefetchOn, "off": state.PrefetchOff}[j.Restore.Prefetch]) // else auto
		if r.online, err = online.Start(ctx, res, r.Store, j.Name, j.DataDir, rate, log); err != nil {
			res.Remote.Close()
			return err
		}
		if r.Writer != nil {
			r.online.Verified, r.online.Unread = r.Writer.Restored, r.Writer.Unread
		}
	}
	for stage, h := range res.Modules {
		if now, ok := r.Hashes[stage]; ok && now != h {
			log.Info("stage module changed since the checkpoint; its state is kept", "stage", stage, "checkpoint_module", ShortHash(h), "module", ShortHash(now))
		}
	}
	log.Info("restore complete", "checkpoint", res.ID, "savepoint", res.Savepoint, "mode", res.Mode, "chain_length", res.ChainLength,
		"duration_ms", res.Duration.Milliseconds(), "bytes_local", res.BytesLocal, "bytes_downloaded", res.BytesDownloaded, "bytes_standby_cache", res.BytesCache,
		"bytes_remote", res.BytesRemote,
		"files", res.Files, "rescaled", res.Rescaled, "from_slots", res.FromSlots, "to_slots", res.ToSlots, "source_seq", res.SourceSeq)
	return nil
}

// extraTargets maps a sub-topology's outputs after the first onto the
// engine's.
func extraTargets(extra []job.ExtraOutput) []engine.OutputTarget {
	var t []engine.OutputTarget
	for _, e := range extra {
		t = append(t, engine.OutputTarget{Stream: e.Stream, Subject: e.Subject, Repartition: e.Repartition, Port: e.Port})
	}
	return t
}

// engineConfig maps the job's fields onto the engine's configuration
// (without the checkpoints and the start position, which Start adds).
func engineConfig(j *job.Job, stages []engine.Stage, log *slog.Logger) engine.Config {
	return engine.Config{
		Job:               j.Name,
		KeyGroups:         j.KeyGroups,
		Slots:             j.Slots,
		InputStream:       j.Input.Stream,
		InputSubjects:     j.Input.Subjects,
		InputTable:        j.Input.Table,
		Extra:             extraTargets(j.Extra),
		Stages:            stages,
		OutputStream:      j.Output.Stream,
		OutputSubject:     j.Output.Subject,
		Delivery:          engine.Delivery(j.Output.Delivery),
		Emit:              engine.Emit(j.Output.Emit),
		Publish:           publishMode(j.Output.Publish),
		DeadLetterStream:  j.DeadLetter.Stream,
		DeadLetterSubject: j.DeadLetter.Subject,
		DataDir:           j.DataDir,
		MaxOutOfOrder:     j.Watermark.MaxOutOfOrderness,
		AllowedLateness:   j.Watermark.AllowedLateness,
		MaxFutureSkew:     futureSkew(j.Watermark.MaxFutureSkew),
		BatchSize:         j.BatchSize,
		MaxMessageBytes:   j.MaxMessage,
		MaxKeyBytes:       j.MaxKeyBytes,
		Logger:            log,
	}
}

// CheckDataDir makes sure the data directory exists (creating it) and that
// cairn can write in it, by creating and removing a file: a data directory
// cairn cannot use is refused with its path and the cause before NATS starts
// (the embedded server stores its streams there) or anything is restored.
func CheckDataDir(dir string) error {
	const fix = "choose another directory with --data or data_dir, or fix its permissions"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("data directory %s cannot be created: %w: %s", dir, err, fix)
	}
	f, err := os.CreateTemp(dir, ".cairn-write-check-*")
	if err != nil {
		return fmt.Errorf("data directory %s is not writable: %w: %s", dir, err, fix)
	}
	name := f.Name()
	err = f.Close()
	if rerr := os.Remove(name); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("data directory %s is not usable: %w: %s", dir, err, fix)
	}
	return nil
}

// futureSkew maps the job's watermark.max_future_skew to the engine's
// (0: the default, negative: off).
func futureSkew(d *job.Duration) time.Duration {
	switch {
	case d == nil:
		return 0
	case d.Off:
		return -1
	}
	return d.Duration
}

func publishMode(p string) engine.PublishMode {
	if p == "auto" {
		return engine.PublishAuto
	}
	return engine.PublishMode(p)
}

// ShortHash is a module hash cut to 12 characters, as logs and tables print it.
func ShortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// compileCacheDir is wazero's on-disk compilation cache: per user, so that
// every run (and every demo in a fresh temp dir) compiles a module once.
func compileCacheDir(dataDir string) string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "cairn", "wazero")
	}
	return filepath.Join(dataDir, "wasm-cache")
}

// Close releases the connection, the runtime and the embedded server.
func (r *Running) Close() {
	// Background loops first: they use the connection and the store. Left
	// to end on their own when the engines were abandoned (a round may
	// take its store timeout).
	for _, l := range r.loops {
		l.cancel()
		if !r.abandoned.Load() {
			<-l.done
		}
	}
	r.loops = nil
	if r.abandoned.Load() {
		// Engines still run: the runtime, the store and the writer are
		// theirs until the process ends.
		if r.NC != nil && !r.borrowed {
			r.NC.Close()
		}
		if r.embedded != nil {
			r.embedded.Shutdown()
		}
		return
	}
	for i := len(r.Downstream) - 1; i >= 0; i-- {
		r.Downstream[i].Close()
	}
	if r.online != nil {
		r.online.Close()
	}
	if r.NC != nil && !r.borrowed {
		_ = r.NC.Drain()
		r.NC.Close()
	}
	if r.Writer != nil {
		_ = r.Writer.Close(context.Background()) // stops its scrub before the store closes
	}
	if r.Store != nil {
		_ = r.Store.Close(context.Background())
	}
	if r.rt != nil && !r.borrowed {
		_ = r.rt.Close(context.Background())
	}
	if r.embedded != nil {
		r.embedded.Shutdown()
	}
}

// loop is a background goroutine of a Running: cancel ends it, done
// closes once it has.
type loop struct {
	cancel context.CancelFunc
	done   <-chan struct{}
}

// ServeHTTP serves the dashboard, /metrics, the JSON APIs and the control
// actions on ln, which comes from dashboard.Listen: it refuses a
// non-loopback address without a token. With a token every request needs
// it, unless acc opens the read-only ones (dashboard.Protect).
func ServeHTTP(ln net.Listener, acc dashboard.Access, r *Running) (stop func()) {
	h, stopObs := Handler(acc, r)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() {
		stopObs()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}

// Handler is ServeHTTP's handler, for a server the caller runs (a group
// member's, which changes what it serves as its share changes); stop ends
// the observer behind it.
func Handler(acc dashboard.Access, r *Running) (h http.Handler, stop func()) {
	obs := newObserver(r)
	ctx, cancelObs := context.WithCancel(context.Background())
	// The first refresh before serving: until it reads the input streams'
	// last sequences, /metrics reports no lag at all.
	obs.refresh(ctx)
	go obs.run(ctx)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/api/stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(r.statsAnswer())
	})
	mux.Handle("/", dashboard.Handler(obs, dashboard.Options{Token: acc.Token, Actions: r.actions()}))
	return dashboard.Protect(mux, acc), cancelObs
}

// StatsAnswer is /api/stats: the first sub-topology's engine.Stats (the
// whole job's when it is one chain) and, for a job graph, every
// sub-topology's in order, named as in /metrics.
type StatsAnswer struct {
	engine.Stats
	SubTopologies []SubTopologyStats `json:"sub_topologies,omitempty"`
	// BrokerWait is what the job waits for between two runs (Reason
	// empty: nothing now), and the runs it resumed; nil before any.
	BrokerWait *BrokerWait `json:"broker_wait,omitempty"`
	// GraphCheckpoint is a job graph's newest graph checkpoint committed
	// by this process (nil before the first, and for a chain).
	GraphCheckpoint *checkpoint.GraphManifest `json:"graph_checkpoint,omitempty"`
}

// GraphCheckpoint returns the newest graph checkpoint this process
// committed: nil before the first, and for a job that is one chain.
func (r *Running) GraphCheckpoint() *checkpoint.GraphManifest { return r.graph.latest() }

// SubTopologyStats is one sub-topology's engine.Stats.
type SubTopologyStats struct {
	Name string `json:"name"`
	engine.Stats
}

func (r *Running) statsAnswer() StatsAnswer {
	a := StatsAnswer{Stats: r.Engine.Stats()}
	if w := r.BrokerWait(); w.Reason != "" || w.Resumes > 0 {
		a.BrokerWait = &w
	}
	if len(r.Downstream) > 0 {
		for _, s := range r.SubTopologies() {
			a.SubTopologies = append(a.SubTopologies, SubTopologyStats{Name: s.Job.Name, Stats: s.Engine.Stats()})
		}
		a.GraphCheckpoint = r.GraphCheckpoint()
	}
	return a
}

// CheckpointAnswer is the JSON answer (Accept: application/json) of the
// checkpoint and savepoint actions.
type CheckpointAnswer struct {
	ID         uint64 `json:"id"`
	SourceSeq  uint64 `json:"source_seq"`
	DurationMs int64  `json:"duration_ms"` // barrier to manifest commit
	Savepoint  string `json:"savepoint,omitempty"`
	// SubTopologies of a job graph: each one's answer, in order (the
	// fields above are the first's).
	SubTopologies []CheckpointAnswer `json:"sub_topologies,omitempty"`
}

// TakeCheckpoint takes a checkpoint (or savepoint, cr.Savepoint) of this
// sub-topology alone (the whole job when it has one) and waits for its
// commit. It answers as the checkpoint action does: the answer, an HTTP
// status, and the text for a person.
func (s *Running) TakeCheckpoint(ctx context.Context, cr engine.CheckpointRequest) (CheckpointAnswer, int, string) {
	if s.Writer == nil {
		return CheckpointAnswer{}, http.StatusConflict, "checkpoints are not configured for this job"
	}
	// A periodic checkpoint in flight is waited for (briefly): a
	// job graph's later sub-topologies must not refuse a savepoint
	// the earlier ones already took.
	id, ok := s.Engine.TriggerCheckpoint(ctx, cr)
	for deadline := time.Now().Add(10 * time.Second); !ok && time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(20 * time.Millisecond)
		id, ok = s.Engine.TriggerCheckpoint(ctx, cr)
	}
	if !ok {
		return CheckpointAnswer{}, http.StatusConflict, "a checkpoint is already in flight; try again"
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	ev, err := s.Engine.WaitCheckpoint(wctx, id)
	if err != nil {
		return CheckpointAnswer{}, http.StatusGatewayTimeout, fmt.Sprintf("checkpoint %d still running: %v", id, err)
	}
	if ev.Err != nil {
		if errors.Is(ev.Err, checkpoint.ErrSavepointExists) { // taken meanwhile
			return CheckpointAnswer{}, http.StatusConflict, SavepointExistsMsg(cr.Savepoint)
		}
		return CheckpointAnswer{}, http.StatusInternalServerError, fmt.Sprintf("checkpoint %d failed: %v", id, ev.Err)
	}
	return CheckpointAnswer{ID: id, SourceSeq: ev.SourceSeq, DurationMs: ev.Duration.Milliseconds(), Savepoint: cr.Savepoint}, http.StatusOK,
		fmt.Sprintf("checkpoint %d committed at source_seq %d in %s", id, ev.SourceSeq, ev.Duration.Round(time.Millisecond))
}

// AnswerCheckpoints is the checkpoint action's answer for the checkpoints
// of a job's sub-topologies, in order: as JSON (the first's fields, and
// every one's in sub_topologies), or a line joining texts.
func AnswerCheckpoints(answers []CheckpointAnswer, texts []string, asJSON bool) (int, string) {
	if asJSON {
		a := answers[0]
		if len(answers) > 1 {
			a.SubTopologies = answers
		}
		b, _ := json.Marshal(a)
		return http.StatusOK, string(b)
	}
	return http.StatusOK, strings.Join(texts, "; ")
}

// actions are the control endpoints: POST /api/action/NAME.
func (r *Running) actions() map[string]func(*http.Request) (int, string) {
	// take checkpoints every sub-topology in order, upstream first: each
	// edge's exactly-once rests on its own indexes and positions, not on
	// a cut, so one after the other is a restorable set.
	take := func(req *http.Request, cr engine.CheckpointRequest) (int, string) {
		var answers []CheckpointAnswer
		var texts []string
		subs := r.SubTopologies()
		for _, s := range subs {
			a, code, text := s.TakeCheckpoint(req.Context(), cr)
			if code != http.StatusOK {
				if len(r.Downstream) > 0 {
					text = "sub-topology " + s.Job.Name + ": " + text
				}
				return code, text
			}
			answers, texts = append(answers, a), append(texts, text)
		}
		if len(answers) > 1 {
			for i := range texts {
				texts[i] = subs[i].Job.Name + ": " + texts[i]
			}
		}
		return AnswerCheckpoints(answers, texts, dashboard.WantsJSON(req))
	}
	return map[string]func(*http.Request) (int, string){
		"checkpoint": func(req *http.Request) (int, string) {
			mode := req.URL.Query().Get("mode")
			if mode != "" && mode != "full" && mode != "incremental" {
				return http.StatusBadRequest, "mode must be full or incremental"
			}
			return take(req, engine.CheckpointRequest{Mode: mode})
		},
		"savepoint": func(req *http.Request) (int, string) {
			name := req.URL.Query().Get("name")
			if err := checkpoint.ValidateSavepointName(name); err != nil {
				return http.StatusBadRequest, err.Error()
			}
			for _, s := range r.SubTopologies() {
				if s.Store != nil && SavepointExists(req.Context(), s.Store, s.Job.Name, name) {
					return http.StatusConflict, SavepointExistsMsg(name)
				}
			}
			return take(req, engine.CheckpointRequest{Savepoint: name})
		},
	}
}

// ErrModuleChanged is returned when a checkpoint to restore was taken with
// another module for a stage than the job's now.
var ErrModuleChanged = errors.New("a stage's module changed since the checkpoint")

// moduleChanged refuses to restore a checkpoint onto a stage whose module
// file changed since it was taken: the new code may read the old state
// differently, which is an upgrade to make on purpose, through a savepoint
// (Flink's rule) or --allow-module-change. Builtins are left out: they
// change with every cairn release and keep their state formats.
func moduleChanged(j *job.Job, m *checkpoint.Manifest, now map[string]string) error {
	for _, s := range j.Stages {
		if strings.HasPrefix(s.Module, "builtin:") || strings.HasPrefix(s.Module, "native:") {
			continue
		}
		old, ok := m.Modules[s.Name]
		if !ok || old == now[s.Name] {
			continue
		}
		return fmt.Errorf("%w: stage %s runs module %s (sha256 %s), checkpoint %d was taken with sha256 %s: restore from a savepoint taken for the upgrade (--restore savepoint:NAME), or pass --allow-module-change if the new module reads the old state",
			ErrModuleChanged, s.Name, s.Module, ShortHash(now[s.Name]), m.ID, ShortHash(old))
	}
	return nil
}
