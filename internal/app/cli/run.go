package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"cairn/internal/app/cmdline"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/app/storelink"
	"cairn/recovery"
)

// Overrides are command-line flags that override job-file fields.
type Overrides struct {
	NATS  string
	Slots int
	// StageSlots sets the slot count of single keyed stages (their
	// sub-topologies) of a job graph, by stage name.
	StageSlots map[string]int
	Data       string
	HTTP       string
	Store      string
	// Memory overrides the job's memory budget.
	Memory string
}

// Apply overrides the job's fields and re-validates it.
func (o Overrides) Apply(j *job.Job) error {
	if o.NATS != "" {
		j.NATS = o.NATS
	}
	if o.Slots != 0 {
		// --slots sets every sub-topology's slot count.
		j.Slots = o.Slots
		for i := range j.Stages {
			j.Stages[i].Slots = 0
		}
	}
	for name, n := range o.StageSlots {
		i := slices.IndexFunc(j.Stages, func(s job.Stage) bool { return s.Name == name })
		if i < 0 || !j.Stages[i].Keyed {
			return &job.Error{Field: "--stage-slots", Reason: fmt.Sprintf("%q is not a keyed stage of the job", name)}
		}
		j.Stages[i].Slots = n
	}
	if o.Data != "" {
		j.DataDir = o.Data
	}
	if o.HTTP != "" {
		j.HTTP = o.HTTP
	}
	if o.Memory != "" {
		j.Memory = o.Memory
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
	fs := cmdline.NewFlagSet("run", "cairn run --job FILE [flags]", stderr)
	jobFile := fs.String("job", "", "job file (YAML), see docs/JOBS.md")
	var o Overrides
	fs.StringVar(&o.NATS, "nats", "", "NATS URL, or \"embedded\" (overrides nats:)")
	fs.IntVar(&o.Slots, "slots", 0, "number of slots of every sub-topology (overrides slots: and the stages' slots:)")
	fs.Func("stage-slots", "slots of single keyed stages of a job graph, like count=2,top=1 (overrides their slots:)", func(v string) error {
		o.StageSlots = map[string]int{}
		for _, kv := range strings.Split(v, ",") {
			name, n, ok := strings.Cut(kv, "=")
			c, err := strconv.Atoi(n)
			if !ok || err != nil || c < 1 {
				return fmt.Errorf("%q is not STAGE=SLOTS", kv)
			}
			o.StageSlots[name] = c
		}
		return nil
	})
	fs.StringVar(&o.Data, "data", "", "data directory (overrides data_dir:)")
	fs.StringVar(&o.HTTP, "http", "", "HTTP listen address for the dashboard, metrics and control (overrides http:; \"off\" disables)")
	fs.StringVar(&o.Store, "store", "", "checkpoint store URL (overrides checkpoint.store:)")
	fs.StringVar(&o.Memory, "memory", "", "memory budget of the process, like 256MiB (overrides memory:)")
	var ro runtime.Options
	fs.StringVar(&ro.Restore, "restore", "latest", "what to restore on start: latest, a checkpoint ID, savepoint:NAME, or none")
	fs.StringVar(&ro.StandbyCache, "standby-cache", "", "a standby's cache directory: restore takes files from it and downloads only what is missing")
	fs.StringVar(&ro.SavepointOnStop, "savepoint-on-stop", "", "on a graceful stop, take a savepoint with this name")
	fs.StringVar(&ro.RestoreMode, "restore-mode", "", "download (every file local before processing) or online (process at once, download in the background); overrides restore.mode")
	fs.BoolVar(&ro.AllowModuleChange, "allow-module-change", false, "restore a checkpoint although a stage's module file changed since (the upgrade path is a savepoint: --restore savepoint:NAME)")
	fs.DurationVar(&ro.StopTimeout, "stop-timeout", runtime.DefaultStopTimeout, "bound of a graceful stop: past it the final checkpoint is given up and cairn exits non-zero (the last committed checkpoint is restored on the next start)")
	fs.DurationVar(&ro.NATSUnreachable, "nats-unreachable-limit", runtime.DefaultNATSUnreachable, "stop the job when its NATS server stays unreachable this long (0: wait forever)")
	fs.BoolVar(&ro.AllowInputGap, "allow-input-gap", false, "go on when records of an input stream are gone before the job read them (purged, or removed by the stream's limits): read on from the stream's first message; without it the job stops naming the stream and the sequences")
	hf := addHTTPFlags(fs)
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	drillReport := fs.String("drill-report", "", "a drill.json (from cairn drill --out DIR) whose results the dashboard shows beside this job's")
	fs.DurationVar(&ro.ProgressEvery, "progress-every", 2*time.Second, "period of the restore's progress reports")
	withParent := fs.Bool("exit-with-parent", false, "exit when the process that started this one exits (cairn demo's job process)")
	storeLink := fs.String("store-link", "off", "put the checkpoint store behind a simulated network link, BANDWIDTH/s,LATENCY like 25MB/s,20ms (cairn demo --link)")
	member := fs.String("member", "", "this process's name in the job's group (a job with a group section; default: host name and a hash of the data directory)")
	stdinEOF := fs.Bool("stop-on-stdin-eof", false, "stop gracefully, as on SIGTERM, when standard input reaches its end (cairn demo's job process: Windows has no SIGTERM)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file until the process stops gracefully (go tool pprof)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	if ro.NATSUnreachable == 0 {
		ro.NATSUnreachable = -1 // the flag's 0 is "never"
	}
	if *withParent {
		go exitWithParent(os.Getppid())
	}
	if *stdinEOF {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
	}
	j, err := loadJob(fs, *jobFile, o)
	if err != nil {
		return err
	}
	if link, err := storelink.Parse(*storeLink); err != nil {
		return fmt.Errorf("--store-link: %w", err)
	} else if !link.Off() {
		ro.WrapStore = link.Wrap
	}
	if m := ro.RestoreMode; m != "" && m != "download" && m != "online" {
		return fmt.Errorf("--restore-mode %q: must be download or online", m)
	}
	log := cmdline.NewLogger(stderr, *logLevel)
	if cmdline.IsTerminal(stderr) {
		ro.Progress = recovery.ProgressPrinter(stderr, true)
	}
	// Listen before Start: an address refused (not loopback without a
	// token) or taken fails now, not after NATS started and a restore ran.
	var ln net.Listener
	acc, err := hf.access(log)
	if err != nil {
		return err
	}
	if j.HTTP != "off" {
		if ln, err = hf.listen(j.HTTP, acc, log); err != nil {
			return err
		}
	}
	if j.Group != nil {
		if ro.Restore != "latest" && !strings.HasPrefix(ro.Restore, "savepoint:") {
			return fmt.Errorf("--restore %s: a group member restores each sub-topology it is given from its newest checkpoint, or a group savepoint when the group starts (--restore savepoint:NAME)", ro.Restore)
		}
		return runMember(ctx, j, ro, *member, ln, acc, log)
	}
	r, err := runtime.Start(ctx, j, ro, log)
	if err != nil {
		if ln != nil {
			_ = ln.Close()
		}
		return err
	}
	// A broker fault the job outlives (a server restart, a full stream)
	// ends a run, not the process: RunResuming starts the next run, which
	// serves on the same listener.
	var keep *runtime.KeepListener
	if ln != nil {
		keep = runtime.NewKeepListener(ln)
		defer keep.Close()
		log.Info("http listening", "addr", ln.Addr().String(), "tls", hf.tlsCert != "", "token", acc.Token != "", "public_read", acc.PublicRead)
	}
	serve := func(r *runtime.Running) func() {
		r.DrillReport = *drillReport
		if keep == nil {
			return func() {}
		}
		return runtime.ServeHTTP(keep.Next(), acc, r)
	}
	log.Info("job running", "job", j.Name, "slots", j.Slots, "key_groups", j.KeyGroups, "nats", runtime.RedactURL(r.NATSURL), "start_seq", r.StartSeq)
	r, err = runtime.RunResuming(ctx, r, j, ro, log, serve)
	if r == nil {
		return err
	}
	defer r.Close()
	st := r.Engine.Stats()
	log.Info("job stopped", "job", j.Name, "records_in", st.RecordsIn, "records_out", st.RecordsOut, "dead_letters", st.DeadLetters, "processed_seq", st.ProcessedSeq)
	return err
}

// exitWithParent ends this process, as a crash would, once its parent is
// gone (it is then adopted by another): a supervisor that was killed leaves
// no job process behind holding the data directory. On Linux the supervisor
// also has the kernel kill it (jobproc's Pdeathsig); this covers the others.
func exitWithParent(parent int) {
	for range time.Tick(250 * time.Millisecond) {
		if os.Getppid() != parent {
			fmt.Fprintln(os.Stderr, "cairn run: the parent process exited; exiting too (--exit-with-parent)")
			os.Exit(1)
		}
	}
}

// loadJob loads the --job file and applies the command-line overrides.
func loadJob(fs *flag.FlagSet, file string, o Overrides) (*job.Job, error) {
	if file == "" {
		fs.Usage()
		return nil, errors.New("--job is required")
	}
	j, err := job.Load(file)
	if err != nil {
		return nil, err
	}
	if err := o.Apply(j); err != nil {
		return nil, err
	}
	return j, nil
}
