// Package drill measures the two numbers of a checkpointed job — how long a
// checkpoint takes and how long a restore takes — by running one for real: an
// embedded NATS server, a generator that builds a keyed state of a chosen
// size, the job as a separate `cairn run` process that is checkpointed
// through its HTTP port and killed with SIGKILL, and then every kind of
// restore, each verified against the state before the kill, each with the
// restore time the restore model (recovery/model) predicted just before it
// beside the measured one. BenchmarkDrillAccuracy runs three drills and
// prints the prediction error of every scenario (AccuracyTable).
//
// With Config.Graph the job is a job graph of two sub-topologies instead
// (graphJobYAML), each with its own checkpoint chain (<job>.s<k>): every
// chain is checkpointed, restored every way and verified on its own.
package drill

import (
	"context"
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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/internal/app/jobproc"
	"cairn/internal/base/datadir"
	"cairn/internal/base/natsembed"
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
	// Graph drills a job graph of two sub-topologies (graphJobYAML)
	// instead of the one-chain count: s0 counts per key as the one-chain
	// job does, s1 counts the pairs (key, count) s0 emitted, so it holds
	// one key per input message. Each sub-topology's chain is checkpointed
	// and restored every way, its scenarios named after it ("s1
	// store-incremental").
	Graph bool
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

	ns  *natsembed.Server
	nc  *nats.Conn
	job *jobproc.Process
	// jobLog is the job process's log file.
	jobLog *os.File
	store  *ThrottledStore
	// chains are the checkpoint chains the drill takes and restores: the
	// job's, or with Config.Graph one per sub-topology, in order.
	chains []*chainRun
}

// chainRun is one checkpoint chain of the drill's job: the job's own, or a
// sub-topology's of a job graph (<job>.s<k>, its data in <data>/s<k>).
type chainRun struct {
	// label names the sub-topology in the report ("s0", "s1"); "" for the
	// one-chain job.
	label   string
	job     string // the chain's name in the store
	dataDir string // its data dir in the job process
	// digest is the state the chain must hold after the input so far.
	digest func(*model) digest
	// keys is the number of keys of its state at the kill.
	keys func(*model) int

	sb    *recovery.Standby
	sbDir string
	// sbBytes, sbTime: the standby's downloads, for the bandwidth.
	sbBytes int64
	sbTime  time.Duration
	// syncs are the standby's syncs as transfers, for the restore model.
	syncs []rmodel.Transfer
	taken []checkpointTaken
	// firstInc is the first incremental checkpoint, firstWant the state
	// it holds (a calibration restores it).
	firstInc  uint64
	firstWant digest
	// head is the chain's last incremental checkpoint, full the full one
	// after it; localKept keeps head's local copy.
	head, full uint64
	localKept  string
	// want is the state at the kill; stateBytes the job's local state
	// then (Pebble's estimate).
	want       digest
	stateBytes int64
	model      *rmodel.Model
}

// name is a scenario's name for this chain: prefixed by the sub-topology.
func (c *chainRun) name(n string) string {
	if c.label == "" {
		return n
	}
	return c.label + " " + n
}

// logPrefix prefixes the chain's progress lines ("" for the one chain).
func (c *chainRun) logPrefix() string {
	if c.label == "" {
		return ""
	}
	return c.label + " "
}

// newChains is the drill's chains: the job's, or a graph's two.
func (d *drill) newChains() []*chainRun {
	count := func(m *model) int {
		n := 0
		for _, c := range m.counts {
			if c > 0 {
				n++
			}
		}
		return n
	}
	if !d.cfg.Graph {
		return []*chainRun{{job: jobName, dataDir: d.jobDataDir(), digest: (*model).digest, keys: count,
			sbDir: filepath.Join(d.work, "standby")}}
	}
	pairs := func(m *model) int {
		n := 0
		for _, c := range m.counts {
			n += int(c)
		}
		return n
	}
	return []*chainRun{
		{label: "s0", job: jobName, dataDir: d.jobDataDir(), digest: (*model).digest, keys: count, sbDir: filepath.Join(d.work, "standby-s0")},
		{label: "s1", job: jobName + ".s1", dataDir: filepath.Join(d.jobDataDir(), "s1"), digest: (*model).pairsDigest, keys: pairs,
			sbDir: filepath.Join(d.work, "standby-s1")},
	}
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
		var err error
		if storeURL, err = checkpoint.FileStoreURL(filepath.Join(d.work, "store"), true); err != nil {
			return err
		}
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
	yaml := jobYAML(cfg)
	if cfg.Graph {
		yaml = graphJobYAML(cfg)
		rep.Config.Graph = graphText
	}

	jobFile := filepath.Join(d.work, "drill-job.yaml")
	if err := os.WriteFile(jobFile, []byte(yaml), 0o644); err != nil {
		return err
	}
	if d.jobLog, err = os.Create(filepath.Join(cfg.Out, "job.log")); err != nil {
		return err
	}
	d.job, err = jobproc.Start(ctx, jobproc.Options{Binary: cfg.Binary, Log: d.jobLog, Args: []string{
		"--job", jobFile, "--nats", d.ns.URL(), "--store", storeURL, "--data", d.jobDataDir(),
		"--http", "127.0.0.1:0", "--log-level", "info",
	}})
	if err != nil {
		return fmt.Errorf("drill: %w", err)
	}
	d.chains = d.newChains()
	for _, c := range d.chains {
		c.sb = recovery.NewStandby(d.store, c.job, c.sbDir, cfg.Logger)
		c.localKept = filepath.Join(c.dataDir, "checkpoints-kept")
	}

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
	if err := d.waitJob(ctx, "build state: process", pub.lastSeq, 0, pub.sent, 0); err != nil {
		return err
	}

	// The incremental chain, then the full checkpoint.
	changed := int(float64(nkeys) * cfg.Change)
	for k := 1; k <= cfg.Chain; k++ {
		if k > 1 && changed > 0 {
			before, sentBefore := pub.lastSeq, pub.sent
			p := d.phase(fmt.Sprintf("change %d/%d: publish", k-1, cfg.Chain-1), "msgs", int64(changed))
			err := pub.publish(ctx, pub.someKeys(nkeys, changed), p)
			p.finish()
			if err != nil {
				return err
			}
			if err := d.waitJob(ctx, fmt.Sprintf("change %d/%d: process", k-1, cfg.Chain-1), pub.lastSeq, before, pub.sent, sentBefore); err != nil {
				return err
			}
		}
		ts, err := d.checkpoint(ctx, "incremental", pub.lastSeq)
		if err != nil {
			return err
		}
		for i, c := range d.chains {
			if k == 1 {
				c.firstInc, c.firstWant = ts[i].ID, c.digest(pub.m)
			}
			c.head = ts[i].ID
		}
	}
	// Local recovery keeps only the newest checkpoint's local copy, and it
	// works for incremental checkpoints (native files): keep the chain
	// head's copy (hard links, as the engine made it) for the local-disk
	// scenario before the full checkpoint replaces it.
	for _, c := range d.chains {
		if err := linkTree(datadir.Checkpoint(datadir.Checkpoints(c.dataDir), c.head),
			datadir.Checkpoint(c.localKept, c.head)); err != nil {
			return fmt.Errorf("drill: keep the local copy of %scheckpoint %d: %w", c.logPrefix(), c.head, err)
		}
	}
	ts, err := d.checkpoint(ctx, "full", pub.lastSeq)
	if err != nil {
		return err
	}
	for i, c := range d.chains {
		c.full = ts[i].ID
	}

	// Kill the job for real.
	for _, c := range d.chains {
		c.want = c.digest(pub.m)
	}
	rep.StateBeforeKill = d.chains[0].want
	st, err := d.job.Stats(ctx)
	if err != nil {
		return err
	}
	rep.JobStateBytesPerSlot = st.StateBytes
	for _, b := range st.StateBytes {
		rep.JobStateBytes += int64(b)
	}
	d.chains[0].stateBytes = rep.JobStateBytes
	if cfg.Graph {
		// The other sub-topologies' state: the dashboard's figures.
		snap, err := readSnapshot(ctx, d.job)
		if err != nil {
			return err
		}
		for _, c := range d.chains[1:] {
			for _, s := range snap.SubTopologies {
				if s.Name == c.job {
					c.stateBytes = int64(s.StateBytes)
				}
			}
			rep.JobStateBytes += c.stateBytes
		}
	}
	killAt := time.Now()
	d.job.Kill()
	d.job = nil
	cfg.Logger.Info("job process killed", "at", killAt)
	if cfg.Graph {
		fmt.Fprintf(d.progress(), "killed the job process (SIGKILL) after the full checkpoints %s; restoring every way\n", d.chainIDs(func(c *chainRun) uint64 { return c.full }))
	} else {
		fmt.Fprintf(d.progress(), "killed the job process (SIGKILL) after checkpoint %d; restoring every way\n", d.chains[0].full)
	}

	// The job's own last local snapshot is the state before the kill: it
	// must equal the model, or the drill measures the wrong thing.
	for _, c := range d.chains {
		own, err := digestDBs(slotDirs(datadir.Checkpoint(datadir.Checkpoints(c.dataDir), c.full), cfg.Slots), cfg.KeyGroups)
		if err != nil {
			return err
		}
		if own != c.want {
			return fmt.Errorf("drill: the job's state at %scheckpoint %d (%v) differs from the generated input's model (%v): the drill's input or the job is wrong", c.logPrefix(), c.full, own, c.want)
		}
	}

	if err := d.collectCheckpoints(ctx); err != nil {
		return err
	}
	var sbBytes int64
	var sbTime time.Duration
	for _, c := range d.chains {
		sbBytes += c.sbBytes
		sbTime += c.sbTime
		rep.StandbyLagBytes += c.sb.Lag().BytesBehind
	}
	if sbTime > 0 && sbBytes > 0 {
		rep.MeasuredBandwidth = int64(float64(sbBytes) / sbTime.Seconds())
	}
	rep.UploadBandwidth = uploadRate(rep.Checkpoints)

	for _, c := range d.chains {
		if err := d.restoreAll(ctx, c); err != nil {
			return err
		}
	}
	if cfg.Graph {
		for _, c := range d.chains {
			rep.SubTopologies = append(rep.SubTopologies, d.subTopologyReport(c, pub.m))
		}
	}
	return nil
}

// chainIDs lists a checkpoint id of every chain: "s0 7, s1 7".
func (d *drill) chainIDs(id func(*chainRun) uint64) string {
	var parts []string
	for _, c := range d.chains {
		parts = append(parts, fmt.Sprintf("%s%d", c.logPrefix(), id(c)))
	}
	return strings.Join(parts, ", ")
}

// subTopologyReport is a graph's chain's figures.
func (d *drill) subTopologyReport(c *chainRun, m *model) SubTopologyReport {
	s := SubTopologyReport{Name: c.label, Job: c.job, Keys: c.keys(m), StateBeforeKill: c.want, JobStateBytes: c.stateBytes,
		StandbyLagBytes: c.sb.Lag().BytesBehind}
	if c.sbTime > 0 && c.sbBytes > 0 {
		s.MeasuredBandwidth = int64(float64(c.sbBytes) / c.sbTime.Seconds())
	}
	var cs []CheckpointFigures
	for _, ck := range d.rep.Checkpoints {
		if ck.SubTopology == c.label {
			cs = append(cs, ck)
		}
	}
	s.UploadBandwidth = uploadRate(cs)
	if c.model != nil {
		s.ModelTerms = c.model.Terms()
		open := s.ModelTerms[rmodel.TermOpen].Value
		s.OpenSeconds = map[string]float64{"incremental": open, "full": open}
	}
	return s
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

// waitJob waits until the job processed the input through seq; a graph's,
// also until its second sub-topology processed the records s0 emitted (one
// per input message: sent in all, sentFrom before this phase).
func (d *drill) waitJob(ctx context.Context, name string, seq, from uint64, sent, sentFrom int64) error {
	p := d.phase(name, "msgs", int64(seq-from))
	err := waitProcessed(ctx, d.job, seq, from, p)
	p.finish()
	if err != nil || !d.cfg.Graph {
		return err
	}
	p = d.phase(name+" (s1)", "msgs", sent-sentFrom)
	err = waitStage(ctx, d.job, jobName+".s1", graphLastStage, sent, sentFrom, p)
	p.finish()
	return err
}

// checkpoint takes one checkpoint of every chain (a graph's: one per
// sub-topology, upstream first, as the job's checkpoint action takes them),
// checks the first covers the input so far, and lets each chain's standby
// follow it. It returns each chain's checkpoint, in order.
func (d *drill) checkpoint(ctx context.Context, mode string, seq uint64) ([]checkpointTaken, error) {
	t, err := d.job.Checkpoint(ctx, mode)
	if err != nil {
		return nil, fmt.Errorf("drill: %w", err)
	}
	ts := []checkpointTaken{t}
	if d.cfg.Graph {
		if ts = t.SubTopologies; len(ts) != len(d.chains) {
			return nil, fmt.Errorf("drill: %s checkpoint of %d sub-topologies, want %d", mode, len(ts), len(d.chains))
		}
	}
	if t := ts[0]; t.SourceSeq != seq {
		return nil, fmt.Errorf("drill: %s %scheckpoint %d covers input up to %d, want %d", mode, d.chains[0].logPrefix(), t.ID, t.SourceSeq, seq)
	}
	for i, c := range d.chains {
		t := ts[i]
		if n := len(c.taken); n > 0 && t.SourceSeq < c.taken[n-1].SourceSeq {
			return nil, fmt.Errorf("drill: %s %scheckpoint %d covers its input up to %d, before the previous one (%d)", mode, c.logPrefix(), t.ID, t.SourceSeq, c.taken[n-1].SourceSeq)
		}
		c.taken = append(c.taken, t)
		fmt.Fprintf(d.progress(), "%scheckpoint %d (%s) committed in %s\n", c.logPrefix(), t.ID, mode, t.Duration.Round(time.Millisecond))
		// The standby follows the store (as `cairn standby` polls it); its
		// downloads through the drill's store measure the bandwidth.
		// A sync's transfer time is the time its reads were open: the
		// listing and the cache's bookkeeping around them are not a restore's
		// download.
		b0, g0, t0 := d.store.BytesDown(), d.store.Gets(), d.store.BusyDown()
		if err := c.sb.Sync(ctx); err != nil {
			return nil, fmt.Errorf("drill: %sstandby: %w", c.logPrefix(), err)
		}
		if b := d.store.BytesDown() - b0; b > 0 {
			el := d.store.BusyDown() - t0
			c.sbBytes += b
			c.sbTime += el
			// Each sync is a transfer the restore model fits its bandwidth
			// and per-object latency from.
			c.syncs = append(c.syncs, rmodel.Transfer{Bytes: b, Objects: int(d.store.Gets() - g0), Seconds: el.Seconds(), From: "standby sync", Time: time.Now()})
		}
	}
	return ts, nil
}

// collectCheckpoints reads every checkpoint's figures and retained storage
// from the store.
func (d *drill) collectCheckpoints(ctx context.Context) error {
	for _, c := range d.chains {
		list, err := checkpoint.List(ctx, d.store, c.job)
		if err != nil {
			return err
		}
		byID := map[uint64]checkpoint.ListEntry{}
		for _, e := range list {
			byID[e.ID] = e
		}
		for _, t := range c.taken {
			e, ok := byID[t.ID]
			if !ok {
				return fmt.Errorf("drill: %scheckpoint %d is not in the store (retention?)", c.logPrefix(), t.ID)
			}
			f := e.Figures
			d.rep.Checkpoints = append(d.rep.Checkpoints, CheckpointFigures{
				SubTopology: c.label,
				ID:          e.ID, Mode: string(e.Mode), ChainLength: e.ChainLength, Time: e.Time, SourceSeq: e.SourceSeq,
				DurationSeconds: t.Duration.Seconds(), SyncSeconds: f.SyncMax.Seconds(), AsyncSeconds: f.Async.Seconds(),
				BytesUploaded: f.BytesUploaded, FilesUploaded: f.FilesUploaded, FilesReused: f.FilesReused,
				FullStateBytes: f.FullStateSize, RetainedExclusiveBytes: e.RetainedExclusive, RetainedSharedBytes: e.RetainedShared,
			})
		}
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
	ns, err := natsembed.Start(natsembed.Options{Name: "cairn-drill", Dir: d.work})
	if err != nil {
		return fmt.Errorf("drill: %w", err)
	}
	d.ns = ns
	if d.nc, err = nats.Connect(ns.URL(), nats.Name("cairn-drill")); err != nil {
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

// graphText describes the graph job in the report.
const graphText = "s0: count per key → rekey → split; s1: count per (key, count) pair"

// graphLastStage is the keyed stage of the graph's second sub-topology.
const graphLastStage = "pairs"

// graphJobYAML is the drill's job graph: the one-chain job's keyed count
// (sub-topology 0), then rekey and split turn each count it emits into the
// key <key><count> (rekey's "<key>=<count>" with split's '=' stripped; the
// keys are hex of one length, so the pair is unambiguous), which a second
// keyed count counts in sub-topology 1, fed by a repartition stream. s1's
// state is one key per input message, value 1: keyed otherwise than s0's,
// grown by inserts where s0's is updated in place, and about as large.
func graphJobYAML(cfg *Config) string {
	return fmt.Sprintf(`name: %s
input: {stream: %s, subjects: [%q]}
stages:
  - {name: count, module: "builtin:count", keyed: true}
  - {name: rekey, module: "builtin:rekey", config: {key: all}}
  - {name: split, module: "builtin:split"}
  - {name: %s, module: "builtin:count", keyed: true}
output: {subject: %s, delivery: core}
key_groups: %d
slots: %d
checkpoint: {interval: 24h, mode: incremental, retain: %d}
`, jobName, inputStream, inputSubject, graphLastStage, outSubject, cfg.KeyGroups, cfg.Slots, cfg.Chain+2)
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
