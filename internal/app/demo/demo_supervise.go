package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/internal/app/cmdline"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/jobproc"
	"cairn/internal/app/runtime"
	"cairn/internal/base/datadir"
	"cairn/internal/base/natsembed"
	"cairn/recovery"
)

// The phases of the job process, as the story and the status line say them.
const (
	phaseStarting   = "starting"
	phaseRestoring  = "restoring"
	phaseCatchingUp = "catching up"
	phaseRunning    = "running"
	phaseStopping   = "stopping"
	phaseStopped    = "stopped"
)

// storyLines is how many lines of the story the dashboard shows.
const storyLines = 12

// demo is a running `cairn demo`: the embedded NATS server, the generator,
// the verifier, the dashboard, and the job as a child process it supervises
// (kills, loses the disk of, rescales and restarts on demand).
type demo struct {
	cfg    demoConfig
	dir    string // the data directory
	binary string
	log    *slog.Logger
	out    io.Writer
	tty    bool

	jobDir, jobFile, storeURL string
	jobLog                    *os.File

	ns    *natsembed.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	store checkpoint.Store
	// linked is the store behind the demo's link (store itself without
	// one): the demo's own restores and transfers go through it, as the
	// job's do through the job's.
	linked checkpoint.Store
	ver    *verifier
	gen    *generator
	model  *restoreModel
	srv    *http.Server
	// seedID is the bulk-loaded checkpoint (0: none): not a checkpoint the
	// job took, so the charts leave it out.
	seedID uint64

	// cmds carries kills, rescales and the final stop to the supervisor.
	cmds chan demoCmd
	// restoreMu is held by a restore (the job's start, or a calibration):
	// one at a time, so neither measures the other.
	restoreMu sync.Mutex
	// outMu serialises terminal output.
	outMu sync.Mutex

	mu struct {
		sync.Mutex
		child *jobproc.Process // nil while the job is down
		slots int
		// snap is the job's last dashboard snapshot (counters, state).
		snap       dashboard.Snapshot
		snapAt     time.Time
		streamLast uint64
		// floor is the restored checkpoint's position: the job has processed
		// at least that far, whatever its first snapshot says.
		floor uint64
		// history holds every checkpoint seen, across job restarts.
		history []dashboard.Checkpoint // by id
		// restores holds the job's restores, with the demo's numbers.
		restores []dashboard.Restore
		story    dashboard.Story
		progress *restoreProgress
		// lags are recent lag samples: the level before a kill.
		lags []lagSample
		// pending is the restart waiting for the lag to come back.
		pending *catchUp
		// failure is the last staged failure and how the job came back.
		failure *dashboard.Failure
		// rescale is the last rescale's preview and result.
		rescale *dashboard.Rescale
		// restartAt is when the job process last started; restoreIdx its
		// restore's index in restores (-1: none).
		restartAt  time.Time
		restoreIdx int
		// series is the throughput and lag history (presenter.go).
		series []dashboard.Sample
		// storage is the store's footprint, measured by housekeep.
		storage *dashboard.Storage
		// budgetSaid is the budget line last said (said again when it changes).
		budgetSaid       string
		prevIn, prevOut  uint64
		lastCalibration  time.Time
		calibratedFullID uint64
	}
}

type lagSample struct {
	at  time.Time
	lag uint64
}

// catchUp is a restart whose kill-to-caught-up time is still running.
type catchUp struct {
	from      time.Time
	threshold uint64
	restore   int // index in restores, -1 if the job restored nothing
	// after is when the new job process served its first snapshot: only
	// later samples count.
	after time.Time
	// what is the event from: "the kill", "the start".
	what string
}

type restoreProgress struct {
	p    recovery.Progress
	line string
}

type cmdKind int

const (
	cmdKill cmdKind = iota
	cmdLoseDisk
	cmdLoseDiskOnline
	cmdRescale
	cmdFinish
)

type demoCmd struct {
	kind  cmdKind
	slots int
	reply chan string
}

func newDemo(c demoConfig, dir, storeURL, binary string, slots int, out io.Writer, log *slog.Logger) *demo {
	d := &demo{
		cfg: c, dir: dir, binary: binary, log: log, out: out, tty: cmdline.IsTerminal(out),
		jobDir: filepath.Join(dir, "job"), jobFile: filepath.Join(dir, "job.yaml"),
		storeURL: storeURL,
		model:    newRestoreModel(dir), cmds: make(chan demoCmd), seedID: loadDemoMemory(dir).Seed,
	}
	d.mu.slots = slots
	d.mu.restoreIdx = -1
	d.mu.story = dashboard.Story{Phase: phaseStarting, Progress: -1}
	return d
}

// supervise runs the job process: it starts it (restoring the latest
// checkpoint), carries out kills, lost disks and rescales, restarts it when
// it dies on its own, and stops it at the end.
func (d *demo) supervise(ctx context.Context) error {
	var err error
	if d.jobLog, err = os.OpenFile(filepath.Join(d.dir, "job.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return err
	}
	failures := 0
	next := restart{reason: "start"}
	d.mu.Lock()
	d.mu.story.Lines = []string{time.Now().Format("15:04:05") + " demo started"}
	d.mu.Unlock()
	for {
		if next.reason != "" {
			if err := d.startJob(ctx, next); err != nil {
				failures++
				d.say(fmt.Sprintf("the job process did not start (%d of 5): %v", failures, err))
				if failures >= 5 {
					return fmt.Errorf("demo: the job process does not start: %w (its log: %s)", err, d.jobLog.Name())
				}
				select {
				case <-time.After(2 * time.Second):
					continue
				case <-ctx.Done():
					return nil
				}
			}
			failures = 0
			next = restart{}
		}
		d.mu.Lock()
		child := d.mu.child
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-child.Exited():
			at, lag := time.Now(), d.preKillLag()
			d.setChild(nil)
			d.story("the job process died", fmt.Sprintf("the job process (pid %d) exited: %s; restarting it", child.Pid(), lastLine(child.Tail())))
			next = restart{reason: "the job process died", at: at, lag: lag}
		case c := <-d.cmds:
			if c.kind == cmdFinish {
				c.reply <- d.stopJob(ctx, child)
				return nil
			}
			next = d.fail(child, c)
		}
	}
}

// restart is why and how the job is started.
type restart struct {
	reason string
	online bool      // restore online: process at once, download in the background
	at     time.Time // the kill; zero for the first start
	lag    uint64    // the lag level before it
}

// fail carries out a kill, a lost disk or a rescale, and says what happened.
func (d *demo) fail(child *jobproc.Process, c demoCmd) restart {
	lag := d.preKillLag()
	at := time.Now()
	child.Kill()
	d.setChild(nil)
	r := restart{at: at, lag: lag}
	var msg string
	switch c.kind {
	case cmdKill:
		r.reason = "kill -9"
		msg = fmt.Sprintf("kill -9: killed the job process (pid %d); it restarts from the local copy of its last checkpoint", child.Pid())
	case cmdLoseDisk, cmdLoseDiskOnline:
		r.reason = "lost the disk"
		how := "it restarts from the store, downloading the whole state before it processes"
		if c.kind == cmdLoseDiskOnline {
			r.reason, r.online = "lost the disk, online restore", true
			how = "it restarts from the store online: processing at once, the state downloading in the background"
		}
		err := os.RemoveAll(d.jobDir)
		msg = fmt.Sprintf("lose the disk: killed the job process (pid %d) and deleted %s (its state and local checkpoint copies); %s", child.Pid(), d.jobDir, how)
		if err != nil {
			msg += fmt.Sprintf(" (delete failed: %v)", err)
		}
	case cmdRescale:
		d.mu.Lock()
		from := d.mu.slots
		d.mu.slots = c.slots
		d.mu.Unlock()
		r.reason = fmt.Sprintf("rescale %d → %d", from, c.slots)
		msg = fmt.Sprintf("rescale: killed the job process (pid %d); it restarts on %d slots instead of %d", child.Pid(), c.slots, from)
		mem := loadDemoMemory(d.dir)
		mem.Slots = c.slots
		_ = saveDemoMemory(d.dir, mem)
	}
	d.mu.Lock()
	d.mu.failure = &dashboard.Failure{Kind: r.reason, TimeMs: at.UnixMilli(), Online: r.online}
	d.mu.Unlock()
	d.story(r.reason, msg)
	c.reply <- msg
	return r
}

// stopJob drains the input and stops the job gracefully: "" or the error.
func (d *demo) stopJob(ctx context.Context, child *jobproc.Process) string {
	d.setPhase(phaseStopping)
	last, err := d.lastSeq(ctx, demoInputStream)
	if err != nil {
		return err.Error()
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := child.Stats(ctx)
		if err != nil {
			return fmt.Sprintf("demo: the job process while draining: %v", err)
		}
		if st.ProcessedSeq >= last {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("demo: the job processed input to %d of %d in 2 minutes", st.ProcessedSeq, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := child.Stop(sctx); err != nil {
		return fmt.Sprintf("demo: stop the job process: %v\n%s", err, child.Tail())
	}
	d.setChild(nil)
	d.setPhase(phaseStopped)
	return ""
}

// startJob tells which checkpoint the job will restore and what that will
// read, starts the job process, and tells how the restore went.
func (d *demo) startJob(ctx context.Context, r restart) error {
	d.restoreMu.Lock()
	defer d.restoreMu.Unlock()
	d.mu.Lock()
	slots := d.mu.slots
	d.mu.floor = 0
	d.mu.Unlock()
	if err := os.WriteFile(d.jobFile, []byte(demoJobYAML(slots, d.cfg.fullEvery(), d.cfg.link.Bandwidth*3/4)), 0o644); err != nil {
		return err
	}
	kind, predicted, ok := "", time.Duration(0), false
	m, err := checkpoint.Latest(ctx, d.store, demoJobName)
	switch {
	case errors.Is(err, checkpoint.ErrNotFound):
		d.storyLine("no checkpoint yet: the job starts from the first line of the input")
	case err != nil:
		d.storyLine(fmt.Sprintf("could not read the latest checkpoint: %v", err))
	default:
		p, perr := recovery.PlanRestore(m, d.restoreOptions(d.jobDir, datadir.Checkpoints(d.jobDir), slots))
		if perr != nil {
			d.storyLine(fmt.Sprintf("checkpoint #%d cannot be restored: %v", m.ID, perr))
			break
		}
		kind = string(p.Mode)
		d.mu.Lock()
		d.mu.floor = m.SourceSeq
		d.mu.Unlock()
		predicted, ok = d.model.predictPlan(p)
		onto := ""
		if p.Rescaled {
			onto = fmt.Sprintf(" onto %d slots (from %d)", p.ToSlots, p.FromSlots)
		}
		if r.online {
			predicted, ok = d.model.predictOnlineFirst(p)
		}
		if p.Rescaled {
			d.storyLine(d.rescalePreview(p, predicted, ok))
		}
		d.mu.Lock()
		if f := d.mu.failure; f != nil {
			f.CheckpointID, f.Mode, f.Chain, f.BytesLocal, f.BytesDownloaded = p.ID, string(p.Mode), p.ChainLength, p.BytesLocal, p.BytesDownload
			if ok {
				f.Predicted = predicted.Seconds()
			}
		}
		d.mu.Unlock()
		what := "predicted"
		if r.online {
			what = "predicted first processing after"
		}
		d.storyLine(fmt.Sprintf("restoring checkpoint #%d (%s)%s: %s local, %s to download; %s %s",
			p.ID, chainText(string(p.Mode), p.ChainLength), onto, runtime.FormatBytes(uint64(p.BytesLocal)), runtime.FormatBytes(uint64(p.BytesDownload)), what, fmtPrediction(predicted, ok)))
	}
	d.setPhase(phaseRestoring)
	mode := "download"
	if r.online {
		mode = "online"
	}
	restartAt := time.Now()
	d.watchFirstOutput(restartAt)
	child, err := jobproc.Start(ctx, jobproc.Options{
		Binary: d.binary, Log: d.jobLog, OnLine: d.jobLine, WithParent: true,
		Args: []string{"--job", d.jobFile, "--restore-mode", mode, "--nats", d.ns.URL(), "--data", d.jobDir, "--store", d.storeURL,
			"--http", "127.0.0.1:0", "--slots", strconv.Itoa(slots), "--log-level", "info",
			"--progress-every", "100ms", "--exit-with-parent", "--memory", d.jobMemory(), "--store-link", d.cfg.link.String()},
	})
	d.mu.Lock()
	d.mu.progress = nil
	d.mu.story.Progress = -1
	d.mu.Unlock()
	if err != nil {
		return err
	}
	d.setChild(child)
	// For a kill from another terminal: kill -9 $(cat DATA/job.pid).
	_ = os.WriteFile(filepath.Join(d.dir, "job.pid"), []byte(strconv.Itoa(child.Pid())+"\n"), 0o644)
	snap, err := d.childSnapshot(ctx, child)
	if err != nil {
		return err
	}
	idx := -1
	if len(snap.Restores) > 0 {
		res := snap.Restores[len(snap.Restores)-1]
		if ok {
			res.PredictedRestore = predicted
		} else {
			res.PredictedRestore = 0
		}
		if kind != "" {
			d.model.observeEntry(res)
		}
		d.mu.Lock()
		d.mu.restores = append(d.mu.restores, res)
		idx = len(d.mu.restores) - 1
		if f := d.mu.failure; f != nil {
			f.Restored = res.Duration.Seconds()
		}
		if rs := d.mu.rescale; rs != nil && res.Rescaled && rs.Measured == 0 {
			rs.Measured = res.Duration.Seconds()
		}
		d.mu.restartAt, d.mu.restoreIdx = restartAt, idx
		d.mu.Unlock()
		what := "restored"
		if res.Online {
			what = "processing again: online restore of"
		}
		d.storyLine(fmt.Sprintf("%s checkpoint #%d in %s (predicted %s%s): %d files, %s read locally, %s downloaded",
			what, res.CheckpointID, fmtDuration(res.Duration), fmtPrediction(predicted, ok), offBy(res.Duration, predicted, ok), res.Files,
			runtime.FormatBytes(uint64(res.BytesLocal)), runtime.FormatBytes(uint64(res.BytesDownloaded))))
	}
	from, threshold, what := r.at, r.lag, "the failure"
	if from.IsZero() { // the demo's own start: from now, to the usual level
		from, threshold, what = time.Now(), uint64(max(d.cfg.rate/5, 100)), "the start"
	}
	d.mu.Lock()
	d.mu.pending = &catchUp{from: from, threshold: threshold, restore: idx, after: time.Now(), what: what}
	d.mu.story.Phase = phaseCatchingUp
	d.mu.Unlock()
	return nil
}

// restoreOptions are the recovery options of the job restoring into dataDir.
func (d *demo) restoreOptions(dataDir, localDir string, slots int) recovery.Options {
	return recovery.Options{
		Store: d.linked, Job: demoJobName, KeyGroups: demoKeyGroups, SourceStream: demoInputStream,
		Slots: slots, DataDir: dataDir, LocalDir: localDir, Logger: slog.New(slog.DiscardHandler),
	}
}

// progressRE reads the job's restore progress log lines.
var progressRE = regexp.MustCompile(`msg="restore progress" phase=(\S+) bytes_done=(\d+) bytes_total=(\d+) files_done=(\d+) files_total=(\d+)`)

// jobLine follows the job's log for its restore progress.
func (d *demo) jobLine(line string) {
	m := progressRE.FindStringSubmatch(line)
	if m == nil {
		return
	}
	atoi := func(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }
	p := recovery.Progress{Phase: recovery.Phase(m[1]), BytesDone: atoi(m[2]), BytesTotal: atoi(m[3]), FilesDone: int(atoi(m[4])), FilesTotal: int(atoi(m[5]))}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.progress == nil {
		d.mu.progress = &restoreProgress{}
	}
	p.Elapsed = time.Duration(0)
	d.mu.progress.p = p
	d.mu.progress.line = recovery.FormatProgress(p, true)
	if p.BytesTotal > 0 {
		d.mu.story.Progress = min(1, float64(p.BytesDone)/float64(p.BytesTotal))
	}
}

// childSnapshot reads the job's dashboard snapshot.
func (d *demo) childSnapshot(ctx context.Context, child *jobproc.Process) (dashboard.Snapshot, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	b, err := child.Get(cctx, "/api/snapshot")
	if err != nil {
		return dashboard.Snapshot{}, err
	}
	return dashboard.DecodeSnapshot(b)
}

// poll follows the job and the input stream twice a second: counters,
// checkpoints, the lag, and whether a restarted job has caught up.
func (d *demo) poll(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if last, err := d.lastSeq(ctx, demoInputStream); err == nil {
			d.mu.Lock()
			d.mu.streamLast = last
			d.mu.Unlock()
		}
		d.mu.Lock()
		child := d.mu.child
		d.mu.Unlock()
		if child == nil {
			continue
		}
		snap, err := d.childSnapshot(ctx, child)
		if err != nil {
			continue
		}
		d.observe(snap, time.Now())
	}
}

// observe takes in a snapshot of the job.
func (d *demo) observe(snap dashboard.Snapshot, at time.Time) {
	d.mu.Lock()
	line := d.observeLocked(snap, at)
	d.mu.Unlock()
	if line != "" {
		d.say(line)
	}
}

// observeLocked returns the story line to print, if any.
func (d *demo) observeLocked(snap dashboard.Snapshot, at time.Time) string {
	d.mu.snap, d.mu.snapAt = snap, at
	d.followOnlineLocked(snap)
	d.addCheckpointsLocked(snap.Checkpoints)
	lag := d.lagLocked()
	if d.mu.story.Phase == phaseRunning { // the level before a failure, not a restart's
		d.mu.lags = append(d.mu.lags, lagSample{at, lag})
	}
	for len(d.mu.lags) > 0 && at.Sub(d.mu.lags[0].at) > 10*time.Second {
		d.mu.lags = d.mu.lags[1:]
	}
	p := d.mu.pending
	if p == nil || at.Before(p.after) || lag > p.threshold {
		return ""
	}
	d.mu.pending = nil
	d.mu.story.Phase = phaseRunning
	z := at.Sub(p.from)
	line := fmt.Sprintf("caught up in %s (lag back to ≤ %d)", fmtDuration(z), p.threshold)
	if f := d.mu.failure; f != nil && f.CaughtUp == 0 && p.what == "the failure" {
		f.CaughtUp = z.Seconds()
	}
	if p.restore >= 0 {
		r := &d.mu.restores[p.restore]
		r.CaughtUp = z
		line += fmt.Sprintf(": checkpoint #%d took %s to take, %s to restore, %s from %s to caught up",
			r.CheckpointID, fmtDuration(r.CheckpointDuration), fmtDuration(r.Duration), fmtDuration(z), p.what)
	}
	d.storyLineLocked(line)
	return line
}

// demoCheckpoint is the dashboard entry of a checkpoint, its predicted
// restore (from the store, into an empty disk) the demo's model's, or
// "calibrating".
func (d *demo) demoCheckpoint(c dashboard.Checkpoint) dashboard.Checkpoint {
	c.PredictedRestore = 0
	if !c.Failed {
		if p, ok := d.model.predictCheckpoint(c, d.mu.slots); ok {
			c.PredictedRestore = p
		}
	}
	return c
}

// addCheckpointsLocked adds the checkpoints not in the history yet, in id
// order. Entries never change once added (the metrics count each once).
func (d *demo) addCheckpointsLocked(cs []dashboard.Checkpoint) {
	for _, c := range cs {
		i, found := slices.BinarySearchFunc(d.mu.history, c.ID, func(h dashboard.Checkpoint, id uint64) int { return cmp.Compare(h.ID, id) })
		if found || c.ID == d.seedID || (i == 0 && len(d.mu.history) >= runtime.HistoryLimit) {
			continue
		}
		d.mu.history = slices.Insert(d.mu.history, i, d.demoCheckpoint(c))
	}
	if n := len(d.mu.history); n > runtime.HistoryLimit {
		d.mu.history = d.mu.history[n-runtime.HistoryLimit:]
	}
}

// storeCheckpoints adds what the store holds to the history: the
// checkpoints a job process committed just before it was killed, which it
// never showed.
func (d *demo) storeCheckpoints(ctx context.Context) {
	list, err := checkpoint.List(ctx, d.store, demoJobName)
	if err != nil {
		return
	}
	cs := make([]dashboard.Checkpoint, 0, len(list))
	for _, e := range list {
		if e.Corrupt != "" {
			continue
		}
		f := e.Figures
		cs = append(cs, dashboard.Checkpoint{
			ID: e.ID, Mode: string(e.Mode), Time: e.Time, SyncDuration: f.SyncMax, AsyncDuration: f.Async,
			BytesUploaded: f.BytesUploaded, FullStateSize: f.FullStateSize, FilesUploaded: f.FilesUploaded,
			FilesReused: f.FilesReused, ChainLength: e.ChainLength,
			RetainedExclusive: e.RetainedExclusive, RetainedShared: e.RetainedShared,
		})
	}
	d.mu.Lock()
	d.addCheckpointsLocked(cs)
	d.mu.Unlock()
}

// lag is the consumer lag now.
func (d *demo) lag() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lagLocked()
}

// lagLocked is the input stream's last sequence minus the job's processed
// one, never below 0: the two are read at different instants, and the job
// may be down (its last known position then).
func (d *demo) lagLocked() uint64 {
	last, done := d.mu.streamLast, max(d.mu.snap.ProcessedSeq, d.mu.floor)
	if last <= done {
		return 0
	}
	return last - done
}

// preKillLag is the lag level before a kill: the highest of the last five
// seconds' samples, at least a tenth of a second of input.
func (d *demo) preKillLag() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	level := uint64(d.cfg.rate / 10)
	now := time.Now()
	for _, s := range d.mu.lags {
		if now.Sub(s.at) <= 5*time.Second {
			level = max(level, s.lag)
		}
	}
	return level
}

// housekeep saves the verifier's state, purges the streams behind it and the
// checkpoints, and calibrates the restore model.
func (d *demo) housekeep(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.storeCheckpoints(ctx)
		pos, err := d.ver.save()
		if err != nil {
			d.log.Warn("demo: save the verifier's state", "err", err)
			continue
		}
		if i%5 == 0 {
			d.measureStorage(ctx)
		}
		if i%5 == 4 {
			pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			if err := purgeDemoStreams(pctx, d.js, d.store, demoJobName, pos); err != nil && ctx.Err() == nil {
				d.log.Warn("demo: retention", "err", err)
			}
			cancel()
		}
		d.calibrate(ctx)
	}
}

func (d *demo) setChild(c *jobproc.Process) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mu.child = c
	if c == nil {
		d.mu.pending = nil
	}
}

func (d *demo) setPhase(p string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mu.story.Phase = p
}

// story starts the story of a restart: its title (with the time) replaces
// the last story's lines.
func (d *demo) story(title, line string) {
	d.mu.Lock()
	d.mu.story.Lines = []string{time.Now().Format("15:04:05") + " " + title}
	d.mu.Unlock()
	d.storyLine(line)
}

// storyLine adds a line to the story, on the dashboard and the terminal.
func (d *demo) storyLine(line string) {
	d.mu.Lock()
	d.storyLineLocked(line)
	d.mu.Unlock()
	d.say(line)
}

// storyLineLocked adds a line to the dashboard's story; the caller prints it.
func (d *demo) storyLineLocked(line string) {
	d.mu.story.Lines = append(d.mu.story.Lines, line)
	if n := len(d.mu.story.Lines); n > storyLines {
		d.mu.story.Lines = d.mu.story.Lines[n-storyLines:]
	}
}

// request hands a kill, lost disk or rescale to the supervisor.
func (d *demo) request(ctx context.Context, c demoCmd) (string, error) {
	if c.kind == cmdRescale {
		d.mu.Lock()
		cur := d.mu.slots
		d.mu.Unlock()
		if hi := min(recovery.MaxRescaleFactor*cur, demoKeyGroups); c.slots < 1 || c.slots > hi {
			return "", fmt.Errorf("rescale to %d slots: from %d slots a restore can have 1 to %d", c.slots, cur, hi)
		}
	}
	d.mu.Lock()
	up := d.mu.child != nil
	d.mu.Unlock()
	if !up {
		return "", errors.New("the job process is not running yet (a restart is in progress); try again in a moment")
	}
	c.reply = make(chan string, 1)
	select {
	case d.cmds <- c:
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(30 * time.Second):
		return "", errors.New("the supervisor is busy with a restart; try again")
	}
	return <-c.reply, nil
}

// jobAction forwards an action to the job process.
func (d *demo) jobAction(ctx context.Context, name, query string) (string, error) {
	d.mu.Lock()
	child := d.mu.child
	d.mu.Unlock()
	if child == nil {
		return "", errors.New("the job process is not running (a restart is in progress); try again in a moment")
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return child.Action(actx, name, query)
}

func (d *demo) savepoint(ctx context.Context, name string) (string, error) {
	if name == "" {
		name = "demo-" + time.Now().Format("150405")
	}
	if err := checkpoint.ValidateSavepointName(name); err != nil {
		return "", err
	}
	msg, err := d.jobAction(ctx, "savepoint", "name="+url.QueryEscape(name))
	return fmt.Sprintf("savepoint %s: %s", name, msg), err
}

// actions are the dashboard's buttons: POST /api/action/NAME.
func (d *demo) actions() map[string]func(*http.Request) (int, string) {
	answer := func(msg string, err error) (int, string) {
		switch {
		case errors.Is(err, jobproc.ErrBusy):
			return http.StatusConflict, msg
		case err != nil:
			return http.StatusConflict, err.Error()
		}
		return http.StatusOK, msg
	}
	return map[string]func(*http.Request) (int, string){
		"kill": func(r *http.Request) (int, string) {
			return answer(d.request(r.Context(), demoCmd{kind: cmdKill}))
		},
		"lose-disk": func(r *http.Request) (int, string) {
			return answer(d.request(r.Context(), demoCmd{kind: cmdLoseDisk}))
		},
		"lose-disk-online": func(r *http.Request) (int, string) {
			return answer(d.request(r.Context(), demoCmd{kind: cmdLoseDiskOnline}))
		},
		"rescale-preview": func(r *http.Request) (int, string) {
			n, err := strconv.Atoi(r.URL.Query().Get("slots"))
			if err != nil {
				return http.StatusBadRequest, "rescale-preview needs ?slots=N"
			}
			return answer(d.previewRescale(r.Context(), n))
		},
		"rescale": func(r *http.Request) (int, string) {
			n, err := strconv.Atoi(r.URL.Query().Get("slots"))
			if err != nil {
				return http.StatusBadRequest, "rescale needs ?slots=N"
			}
			return answer(d.request(r.Context(), demoCmd{kind: cmdRescale, slots: n}))
		},
		"full-checkpoint": func(r *http.Request) (int, string) {
			return answer(d.jobAction(r.Context(), "checkpoint", "mode=full"))
		},
		"savepoint": func(r *http.Request) (int, string) {
			return answer(d.savepoint(r.Context(), r.URL.Query().Get("name")))
		},
	}
}

// Snapshot implements dashboard.Source: the job's last snapshot, with the
// checkpoint history and the restores across job restarts, the lag from the
// demo's own view of the input stream, and the story.
func (d *demo) Snapshot() dashboard.Snapshot {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.mu.snap
	s.Job, s.Slots, s.KeyGroups = demoJobName, d.mu.slots, demoKeyGroups
	if s.Watermark == 0 {
		s.Watermark = minWatermark
	}
	s.ProcessedSeq = max(s.ProcessedSeq, d.mu.floor)
	s.StreamLastSeq = max(d.mu.streamLast, s.ProcessedSeq)
	s.Checkpoints = append([]dashboard.Checkpoint(nil), d.mu.history...)
	s.Restores = append([]dashboard.Restore(nil), d.mu.restores...)
	st := d.mu.story
	st.Lines = append([]string(nil), st.Lines...)
	s.Story = &st
	s.Presenter = d.presenterLocked()
	s.Series = slices.Clone(d.mu.series)
	return s
}

// minWatermark is "no watermark" (math.MinInt64).
const minWatermark = -1 << 63

// lastLine is the last line of a log tail.
func lastLine(tail string) string {
	for i := len(tail) - 1; i > 0; i-- {
		if tail[i] == '\n' {
			return tail[i+1:]
		}
	}
	return tail
}

var _ dashboard.Source = (*demo)(nil)

// jobMemory is the job process's --memory: its part of the demo's budget
// ("0" turns the budget off).
func (d *demo) jobMemory() string {
	if _, n := splitDemoMemory(d.cfg.memory); n > 0 {
		return strconv.FormatInt(n, 10)
	}
	return ""
}
