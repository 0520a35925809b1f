package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/job"
	"cairn/wasm"
)

// Overrides are command-line flags that override job-file fields.
type Overrides struct {
	NATS  string
	Slots int
	Data  string
	HTTP  string
	Store string
}

// Apply overrides the job's fields and re-validates it.
func (o Overrides) Apply(j *job.Job) error {
	if o.NATS != "" {
		j.NATS = o.NATS
	}
	if o.Slots != 0 {
		j.Slots = o.Slots
	}
	if o.Data != "" {
		j.DataDir = o.Data
	}
	if o.HTTP != "" {
		j.HTTP = o.HTTP
	}
	if o.Store != "" {
		if j.Checkpoint == nil {
			j.Checkpoint = &job.Checkpoint{}
		}
		j.Checkpoint.Store = o.Store
		j.SetDefaults()
	}
	return j.Validate()
}

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", "cairn run --job FILE [flags]", stderr)
	jobFile := fs.String("job", "", "job file (YAML), see docs/JOBS.md")
	var o Overrides
	fs.StringVar(&o.NATS, "nats", "", "NATS URL, or \"embedded\" (overrides nats:)")
	fs.IntVar(&o.Slots, "slots", 0, "number of slots (overrides slots:)")
	fs.StringVar(&o.Data, "data", "", "data directory (overrides data_dir:)")
	fs.StringVar(&o.HTTP, "http", "", "HTTP listen address for stats and metrics (overrides http:; \"off\" disables)")
	fs.StringVar(&o.Store, "store", "", "checkpoint store URL (overrides checkpoint.store:)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *jobFile == "" {
		fs.Usage()
		return errors.New("--job is required")
	}
	j, err := job.Load(*jobFile)
	if err != nil {
		return err
	}
	if err := o.Apply(j); err != nil {
		return err
	}
	log := newLogger(stderr, *logLevel)
	r, err := Start(ctx, j, log)
	if err != nil {
		return err
	}
	defer r.Close()
	if j.HTTP != "off" {
		addr, stopHTTP, err := serveHTTP(j.HTTP, r)
		if err != nil {
			return err
		}
		defer stopHTTP()
		log.Info("http listening", "addr", addr)
	}
	log.Info("job running", "job", j.Name, "slots", j.Slots, "key_groups", j.KeyGroups, "nats", redactURL(r.NATSURL))
	err = r.Engine.Run(ctx)
	st := r.Engine.Stats()
	log.Info("job stopped", "job", j.Name, "records_in", st.RecordsIn, "records_out", st.RecordsOut, "dead_letters", st.DeadLetters, "processed_seq", st.ProcessedSeq)
	return err
}

// Running is a started job: its NATS connection (and embedded server) and
// its engine, ready to Run.
type Running struct {
	Job     *job.Job
	Engine  *engine.Engine
	NC      *nats.Conn
	NATSURL string
	Hashes  map[string]string

	Writer *checkpoint.Writer // nil without checkpoints
	Store  checkpoint.Store   // nil without checkpoints

	embedded *EmbeddedNATS
	rt       *wasm.Runtime
}

// Start connects (starting the embedded server when asked), compiles the
// modules and builds the engine.
func Start(ctx context.Context, j *job.Job, log *slog.Logger) (_ *Running, err error) {
	r := &Running{Job: j}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	r.NATSURL = j.NATS
	if j.NATS == "embedded" {
		if r.embedded, err = StartEmbeddedNATS(j.DataDir, 0); err != nil {
			return nil, err
		}
		r.NATSURL = r.embedded.URL()
	}
	if r.NC, err = connect(r.NATSURL, j.NATSAuth, "cairn-"+j.Name); err != nil {
		return nil, err
	}
	if r.rt, err = wasm.NewRuntime(ctx, wasm.RuntimeConfig{CacheDir: filepath.Join(j.DataDir, "wasm-cache")}); err != nil {
		return nil, err
	}
	stages, hashes, err := buildStages(ctx, r.rt, j, log)
	if err != nil {
		return nil, err
	}
	r.Hashes = hashes
	cfg := engine.Config{
		Job:               j.Name,
		KeyGroups:         j.KeyGroups,
		Slots:             j.Slots,
		InputStream:       j.Input.Stream,
		InputSubjects:     j.Input.Subjects,
		Stages:            stages,
		OutputStream:      j.Output.Stream,
		OutputSubject:     j.Output.Subject,
		Delivery:          engine.Delivery(j.Output.Delivery),
		DeadLetterStream:  j.DeadLetter.Stream,
		DeadLetterSubject: j.DeadLetter.Subject,
		DataDir:           j.DataDir,
		MaxOutOfOrder:     j.Watermark.MaxOutOfOrderness,
		BatchSize:         j.BatchSize,
		MaxMessageBytes:   j.MaxMessage,
		Logger:            log,
	}
	if j.Checkpoint != nil {
		if cfg.Checkpoint, r.Writer, r.Store, err = setupCheckpoints(ctx, j, hashes, log); err != nil {
			return nil, err
		}
	}
	if r.Engine, err = engine.New(cfg, r.NC); err != nil {
		return nil, err
	}
	if r.Writer != nil {
		r.Engine.SetNextCheckpointID(r.Writer.NextID())
	}
	return r, nil
}

// Close releases the connection, the runtime and the embedded server.
func (r *Running) Close() {
	if r.NC != nil {
		_ = r.NC.Drain()
		r.NC.Close()
	}
	if r.Store != nil {
		_ = r.Store.Close(context.Background())
	}
	if r.rt != nil {
		_ = r.rt.Close(context.Background())
	}
	if r.embedded != nil {
		r.embedded.Shutdown()
	}
}

// serveHTTP serves /healthz and /api/stats.
func serveHTTP(addr string, r *Running) (string, func(), error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/api/stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(r.Engine.Stats())
	})
	mux.HandleFunc("POST /api/checkpoint", func(w http.ResponseWriter, req *http.Request) {
		if r.Writer == nil {
			http.Error(w, "checkpoints are not configured for this job", http.StatusConflict)
			return
		}
		mode := req.URL.Query().Get("mode")
		if mode != "" && mode != "full" && mode != "incremental" {
			http.Error(w, "mode must be full or incremental", http.StatusBadRequest)
			return
		}
		if !r.Engine.TriggerCheckpoint(req.Context(), mode) {
			http.Error(w, "a checkpoint is already in flight", http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("/api/checkpoints", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var stats []checkpoint.Stats
		if r.Writer != nil {
			stats = r.Writer.Stats()
		}
		_ = json.NewEncoder(w).Encode(stats)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("http: listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
