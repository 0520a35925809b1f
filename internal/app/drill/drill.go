// Package drill measures the two numbers of a checkpointed job — how long a
// checkpoint takes and how long a restore takes — by running one for real: an
// embedded NATS server, a generator that builds a keyed state of a chosen
// size, the job as a separate `cairn run` process that is checkpointed
// through its HTTP port and killed with SIGKILL, and then every kind of
// restore, each verified against the state before the kill, each with the
// restore time the restore model (recovery/model) predicted just before it
// beside the measured one. BenchmarkDrillAccuracy runs three drills and
// prints the prediction error of every scenario (AccuracyTable).
package drill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/internal/app/jobproc"
	"cairn/internal/datadir"
	"cairn/recovery"
	rmodel "cairn/recovery/model"
)

// Config is what a drill measures.
type Config struct {
	// StateBytes is the target size of the job's state (about keys ×
	// (ValueBytes + 16)).
	StateBytes int64
	// Change is the fraction of keys updated between two checkpoints.
	Change float64
	// Slots is the job's slot count; RescaleTo the slot count of the
	// rescaled restores (equal to Slots: none).
	Slots, RescaleTo int
	// KeyGroups is the job's key_groups (default 128).
	KeyGroups int
	// Store is the checkpoint store URL ("": a file store in the work dir).
	Store string
	// Bandwidth limits the drill's own store traffic in bytes/s per
	// direction (0: unthrottled). It applies to every restore and to the
	// standby's downloads; the job process uploads unthrottled.
	Bandwidth int64
	// Chain is the number of incremental checkpoints before the full one.
	Chain int
	// ValueBytes is the bytes of state per key. The job is the builtin
	// count, whose value is a small decimal count, so these bytes are the
	// key's: keys are ValueBytes hex characters.
	ValueBytes int
	// Out is the report directory (drill.json, drill.html, job.log).
	Out string
	// WorkDir holds the NATS data, the store (by default) and the restored
	// data dirs ("": a temp dir, removed at the end).
	WorkDir string
	// Binary is the cairn executable that runs the job process.
	Binary string
	// Stdout receives the table; Progress the progress lines or bars (nil:
	// none), drawn as bars when TTY.
	Stdout, Progress io.Writer
	TTY              bool
	// Logger receives details (nil: discarded).
	Logger *slog.Logger
	// Seed makes the choice of changed keys repeatable.
	Seed uint64
	// Repeat is how many times each scenario restores (0: once). A
	// scenario's row is then the median restore, predicted before the
	// first; every restore calibrates the model.
	Repeat int
}

func (c *Config) defaults() error {
	if c.Binary == "" {
		return errNoBinary
	}
	if c.StateBytes <= 0 {
		c.StateBytes = 64 << 20
	}
	if c.ValueBytes == 0 {
		c.ValueBytes = 100
	}
	if c.ValueBytes < 16 || c.ValueBytes > 4096 {
		return fmt.Errorf("drill: --value-bytes %d: want 16 to 4096", c.ValueBytes)
	}
	if c.Change < 0 || c.Change > 1 {
		return fmt.Errorf("drill: --change %g: want a fraction from 0 to 1", c.Change)
	}
	if c.Slots <= 0 {
		c.Slots = 2
	}
	if c.RescaleTo <= 0 {
		c.RescaleTo = 1
	}
	if c.KeyGroups <= 0 {
		c.KeyGroups = 128
	}
	if c.Slots > c.KeyGroups || c.RescaleTo > c.KeyGroups {
		return fmt.Errorf("drill: --slots %d / --rescale-to %d: at most key_groups=%d", c.Slots, c.RescaleTo, c.KeyGroups)
	}
	if c.Chain < 1 {
		return fmt.Errorf("drill: --chain %d: at least one incremental checkpoint", c.Chain)
	}
	if c.Out == "" {
		c.Out = "drill-out"
	}
	if c.Stdout == nil {
		c.Stdout = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	return nil
}

// keys is the key count for the configured state size: per key about
// ValueBytes of key, the 5-byte key prefix, a 1–2 byte count with its
// header, and Pebble's 8-byte trailer.
func (c *Config) keys() int {
	return max(1, int(c.StateBytes/int64(c.ValueBytes+16)))
}

// Run runs a drill and writes its report. The returned report is also
// written when a scenario's state check failed; the error then says which.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	work := cfg.WorkDir
	if work == "" {
		d, err := os.MkdirTemp("", "cairn-drill-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		work = d
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	d := &drill{cfg: cfg, work: work, rep: &Report{Started: time.Now().UTC()}}
	defer d.close()
	if err := d.run(ctx); err != nil {
		return nil, err
	}
	if err := d.rep.write(cfg.Out, cfg.Stdout); err != nil {
		return d.rep, err
	}
	var bad []string
	for _, s := range d.rep.Scenarios {
		if !s.StateEqual {
			bad = append(bad, s.Name)
		}
	}
	if len(bad) > 0 {
		return d.rep, fmt.Errorf("drill: restored state differs from the state before the kill in: %s (see %s)", strings.Join(bad, ", "), filepath.Join(cfg.Out, "drill.json"))
	}
	return d.rep, nil
}

// drill is one run's working state.
type drill struct {
	cfg  Config
	work string
	rep  *Report

	ns  *server.Server
	nc  *nats.Conn
	job *jobproc.Process
	// jobLog is the job process's log file.
	jobLog *os.File
	store  *ThrottledStore
	sb     *recovery.Standby
	// sbBytes, sbTime: the standby's downloads, for the bandwidth.
	sbBytes int64
	sbTime  time.Duration
	// syncs are the standby's syncs as transfers, for the restore model.
	syncs []rmodel.Transfer
	// firstInc is the first incremental checkpoint, firstWant the state
	// it holds (a calibration restores it).
	firstInc  uint64
	firstWant digest
}

func (d *drill) close() {
	if d.job != nil {
		d.job.Kill()
	}
	if d.jobLog != nil {
		_ = d.jobLog.Close()
	}
	if d.nc != nil {
		d.nc.Close()
	}
	if d.ns != nil {
		d.ns.Shutdown()
		d.ns.WaitForShutdown()
	}
	if d.store != nil {
		_ = d.store.Close(context.Background())
	}
}

func (d *drill) jobDataDir() string { return filepath.Join(d.work, "job") }

func (d *drill) run(ctx context.Context) error {
	cfg := &d.cfg
	rep := d.rep
	if err := d.startNATS(); err != nil {
		return err
	}
	storeURL := cfg.Store
	if storeURL == "" {
		storeURL = "file://" + filepath.Join(d.work, "store") + "?create_dir=true"
	}
	inner, err := checkpoint.OpenStore(ctx, storeURL)
	if err != nil {
		return err
	}
	d.store = NewThrottledStore(inner, cfg.Bandwidth)
	nkeys := cfg.keys()
	rep.Config = ReportConfig{
		StateBytes: cfg.StateBytes, Keys: nkeys, ValueBytes: cfg.ValueBytes, Change: cfg.Change, Slots: cfg.Slots,
		RescaleTo: cfg.RescaleTo, KeyGroups: cfg.KeyGroups, Store: redactURL(storeURL), BandwidthBytesPerSec: cfg.Bandwidth,
		Chain: cfg.Chain, Throttled: throttledWhat(cfg.Bandwidth), Repeat: max(1, cfg.Repeat),
	}

	jobFile := filepath.Join(d.work, "drill-job.yaml")
	if err := os.WriteFile(jobFile, []byte(jobYAML(cfg)), 0o644); err != nil {
		return err
	}
	if d.jobLog, err = os.Create(filepath.Join(cfg.Out, "job.log")); err != nil {
		return err
	}
	d.job, err = jobproc.Start(ctx, jobproc.Options{Binary: cfg.Binary, Log: d.jobLog, Args: []string{
		"--job", jobFile, "--nats", d.ns.ClientURL(), "--store", storeURL, "--data", d.jobDataDir(),
		"--http", "127.0.0.1:0", "--log-level", "info",
	}})
	if err != nil {
		return fmt.Errorf("drill: %w", err)
	}
	d.sb = recovery.NewStandby(d.store, jobName, filepath.Join(d.work, "standby"), cfg.Logger)

	js, err := jetstream.New(d.nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return err
	}
	pub := &publisher{js: js, m: &model{keyBytes: cfg.ValueBytes, counts: make([]uint32, nkeys)}, rnd: rand.New(rand.NewPCG(cfg.Seed, 0x5eed))}

	// Build the state.
	p := d.phase("build state: publish", "msgs", int64(nkeys))
	err = pub.publish(ctx, allKeys(nkeys), p)
	p.finish()
	if err != nil {
		return err
	}
	if err := d.waitJob(ctx, "build state: process", pub.lastSeq, 0); err != nil {
		return err
	}

	// The incremental chain, then the full checkpoint.
	changed := int(float64(nkeys) * cfg.Change)
	var chainHead checkpointTaken
	for k := 1; k <= cfg.Chain; k++ {
		if k > 1 && changed > 0 {
			before := pub.lastSeq
			p := d.phase(fmt.Sprintf("change %d/%d: publish", k-1, cfg.Chain-1), "msgs", int64(changed))
			err := pub.publish(ctx, pub.someKeys(nkeys, changed), p)
			p.finish()
			if err != nil {
				return err
			}
			if err := d.waitJob(ctx, fmt.Sprintf("change %d/%d: process", k-1, cfg.Chain-1), pub.lastSeq, before); err != nil {
				return err
			}
		}
		t, err := d.checkpoint(ctx, "incremental", pub.lastSeq)
		if err != nil {
			return err
		}
		if k == 1 {
			d.firstInc, d.firstWant = t.ID, pub.m.digest()
		}
		chainHead = t
	}
	// Local recovery keeps only the newest checkpoint's local copy, and it
	// works for incremental checkpoints (native files): keep the chain
	// head's copy (hard links, as the engine made it) for the local-disk
	// scenario before the full checkpoint replaces it.
	localKept := filepath.Join(d.jobDataDir(), "checkpoints-kept")
	if err := linkTree(datadir.Checkpoint(datadir.Checkpoints(d.jobDataDir()), chainHead.ID),
		datadir.Checkpoint(localKept, chainHead.ID)); err != nil {
		return fmt.Errorf("drill: keep the local copy of checkpoint %d: %w", chainHead.ID, err)
	}
	full, err := d.checkpoint(ctx, "full", pub.lastSeq)
	if err != nil {
		return err
	}

	// Kill the job for real.
	want := pub.m.digest()
	rep.StateBeforeKill = want
	st, err := d.job.Stats(ctx)
	if err != nil {
		return err
	}
	rep.JobStateBytesPerSlot = st.StateBytes
	for _, b := range st.StateBytes {
		rep.JobStateBytes += int64(b)
	}
	killAt := time.Now()
	d.job.Kill()
	d.job = nil
	cfg.Logger.Info("job process killed", "at", killAt)
	fmt.Fprintf(d.progress(), "killed the job process (SIGKILL) after checkpoint %d; restoring every way\n", full.ID)

	// The job's own last local snapshot is the state before the kill: it
	// must equal the model, or the drill measures the wrong thing.
	own, err := digestDBs(slotDirs(datadir.Checkpoint(datadir.Checkpoints(d.jobDataDir()), full.ID), cfg.Slots), cfg.KeyGroups)
	if err != nil {
		return err
	}
	if own != want {
		return fmt.Errorf("drill: the job's state at checkpoint %d (%v) differs from the generated input's model (%v): the drill's input or the job is wrong", full.ID, own, want)
	}

	if err := d.collectCheckpoints(ctx); err != nil {
		return err
	}
	if d.sbTime > 0 && d.sbBytes > 0 {
		rep.MeasuredBandwidth = int64(float64(d.sbBytes) / d.sbTime.Seconds())
	}
	rep.UploadBandwidth = uploadRate(rep.Checkpoints)
	lag := d.sb.Lag()
	rep.StandbyLagBytes = lag.BytesBehind

	return d.restoreAll(ctx, chainHead.ID, full.ID, localKept, want)
}

func throttledWhat(bw int64) string {
	if bw <= 0 {
		return "nothing (unthrottled)"
	}
	return "downloads: every restore and the standby's sync (the job process uploads unthrottled)"
}

func (d *drill) progress() io.Writer {
	if d.cfg.Progress == nil {
		return io.Discard
	}
	return d.cfg.Progress
}

func (d *drill) phase(name, unit string, total int64) *phaseProgress {
	return startPhase(d.cfg.Progress, d.cfg.TTY, name, unit, total)
}

func (d *drill) waitJob(ctx context.Context, name string, seq, from uint64) error {
	p := d.phase(name, "msgs", int64(seq-from))
	err := waitProcessed(ctx, d.job, seq, from, p)
	p.finish()
	return err
}

// checkpoint takes one checkpoint, checks it covers the input so far, and
// lets the standby follow it.
func (d *drill) checkpoint(ctx context.Context, mode string, seq uint64) (checkpointTaken, error) {
	t, err := d.job.Checkpoint(ctx, mode)
	if err != nil {
		return t, fmt.Errorf("drill: %w", err)
	}
	if t.SourceSeq != seq {
		return t, fmt.Errorf("drill: %s checkpoint %d covers input up to %d, want %d", mode, t.ID, t.SourceSeq, seq)
	}
	d.rep.taken = append(d.rep.taken, t)
	fmt.Fprintf(d.progress(), "checkpoint %d (%s) committed in %s\n", t.ID, mode, t.Duration.Round(time.Millisecond))
	// The standby follows the store (as `cairn standby` polls it); its
	// downloads through the drill's store measure the bandwidth.
	// A sync's transfer time is the time its reads were open: the
	// listing and the cache's bookkeeping around them are not a restore's
	// download.
	b0, g0, t0 := d.store.BytesDown(), d.store.Gets(), d.store.BusyDown()
	if err := d.sb.Sync(ctx); err != nil {
		return t, fmt.Errorf("drill: standby: %w", err)
	}
	if b := d.store.BytesDown() - b0; b > 0 {
		el := d.store.BusyDown() - t0
		d.sbBytes += b
		d.sbTime += el
		// Each sync is a transfer the restore model fits its bandwidth
		// and per-object latency from.
		d.syncs = append(d.syncs, rmodel.Transfer{Bytes: b, Objects: int(d.store.Gets() - g0), Seconds: el.Seconds(), From: "standby sync", Time: time.Now()})
	}
	return t, nil
}

// collectCheckpoints reads every checkpoint's figures and retained storage
// from the store.
func (d *drill) collectCheckpoints(ctx context.Context) error {
	list, err := checkpoint.List(ctx, d.store, jobName)
	if err != nil {
		return err
	}
	byID := map[uint64]checkpoint.ListEntry{}
	for _, e := range list {
		byID[e.ID] = e
	}
	for _, t := range d.rep.taken {
		e, ok := byID[t.ID]
		if !ok {
			return fmt.Errorf("drill: checkpoint %d is not in the store (retention?)", t.ID)
		}
		f := e.Figures
		d.rep.Checkpoints = append(d.rep.Checkpoints, CheckpointFigures{
			ID: e.ID, Mode: string(e.Mode), ChainLength: e.ChainLength, Time: e.Time, SourceSeq: e.SourceSeq,
			DurationSeconds: t.Duration.Seconds(), SyncSeconds: f.SyncMax.Seconds(), AsyncSeconds: f.Async.Seconds(),
			BytesUploaded: f.BytesUploaded, FilesUploaded: f.FilesUploaded, FilesReused: f.FilesReused,
			FullStateBytes: f.FullStateSize, RetainedExclusiveBytes: e.RetainedExclusive, RetainedSharedBytes: e.RetainedShared,
		})
	}
	return nil
}

func uploadRate(cs []CheckpointFigures) int64 {
	var b int64
	var s float64
	for _, c := range cs {
		b += c.BytesUploaded
		s += c.AsyncSeconds
	}
	if s <= 0 {
		return 0
	}
	return int64(float64(b) / s)
}

func (d *drill) startNATS() error {
	opts := &server.Options{
		ServerName: "cairn-drill", Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: filepath.Join(d.work, "nats"),
		NoLog: true, NoSigs: true, DisableJetStreamBanner: true,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("drill: embedded nats: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return errors.New("drill: embedded nats: not ready after 10s")
	}
	d.ns = ns
	if d.nc, err = nats.Connect(ns.ClientURL(), nats.Name("cairn-drill")); err != nil {
		return fmt.Errorf("drill: nats: %w", err)
	}
	js, err := jetstream.New(d.nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: inputStream, Subjects: []string{inputSubject}, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("drill: create stream %s: %w", inputStream, err)
	}
	return nil
}

// jobYAML is the drill's job: a keyed count over the input, outputs on a
// core subject (the drill measures state, not output delivery), checkpoints
// only when the drill asks (the interval is a day), every checkpoint of the
// drill retained.
func jobYAML(cfg *Config) string {
	return fmt.Sprintf(`name: %s
input: {stream: %s, subjects: [%q]}
stages:
  - {name: count, module: "builtin:count", keyed: true}
output: {subject: %s, delivery: core}
key_groups: %d
slots: %d
checkpoint: {interval: 24h, mode: incremental, retain: %d}
`, jobName, inputStream, inputSubject, outSubject, cfg.KeyGroups, cfg.Slots, cfg.Chain+2)
}

// linkTree copies the directory tree src to dst with hard links.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if e.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		return os.Link(p, target)
	})
}

// slotDirs is base/slot-<i> for every slot: a state directory's or a local
// checkpoint's slot folders.
func slotDirs(base string, slots int) []string {
	out := make([]string, slots)
	for i := range out {
		out[i] = datadir.SlotIn(base, i)
	}
	return out
}

// percentile of sorted-in-place durations (nearest rank).
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	i := int(p*float64(len(v))+0.5) - 1
	return v[min(max(i, 0), len(v)-1)]
}

// redactURL hides a password in a URL's user info.
func redactURL(u string) string {
	at := strings.LastIndex(u, "@")
	s := strings.Index(u, "://")
	if at < 0 || s < 0 || s > at {
		return u
	}
	return u[:s+3] + "***" + u[at:]
}
