package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"cairn/internal/app/cmdline"
	"cairn/internal/app/drill"
	"cairn/internal/app/job"
)

// cmdDrill measures checkpoint duration and restore time for real: it runs
// the job as a child process of this binary, kills it, and restores it every
// way (see internal/app/drill).
func cmdDrill(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("drill", "cairn drill [flags]", stderr)
	stateSize := fs.String("state", "64MiB", "target state size (keys × --value-bytes)")
	change := fs.Float64("change", 0.01, "fraction of keys updated between two checkpoints")
	slots := fs.Int("slots", 2, "slots of the job")
	rescale := fs.Int("rescale-to", 1, "slot count of the rescaled restores (= --slots: none)")
	store := fs.String("store", "", "checkpoint store URL (default: a file store in the work directory)")
	bandwidth := fs.String("bandwidth", "0", "limit on the drill's store traffic per direction, bytes/s (e.g. 50MB, 8MiB; 0: unthrottled); restores and the standby are throttled, the job's uploads are not")
	chain := fs.Int("chain", 5, "incremental checkpoints before the full one")
	out := fs.String("out", "drill-out", "report directory (drill.json, drill.html, job.log)")
	valueBytes := fs.Int("value-bytes", 100, "state bytes per key (the job is a keyed count: these bytes are the key's)")
	work := fs.String("work", "", "work directory, kept afterwards (default: a temporary directory, removed)")
	seed := fs.Uint64("seed", 1, "seed of the choice of changed keys")
	repeat := fs.Int("repeat", 3, "restores per scenario, in rounds (a row is the median, each restore predicted just before it runs)")
	graph := fs.Bool("graph", false, "drill a job graph of two sub-topologies (a count per key, then a count per (key, count) pair behind a repartition stream) instead of the one-chain count: each sub-topology's checkpoint chain is restored every way, its rows named s0 and s1")
	logLevel := fs.String("log-level", "error", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *repeat < 1 {
		return fmt.Errorf("--repeat %d: at least 1", *repeat)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	size, err := job.ParseBytes(*stateSize)
	if err != nil {
		return fmt.Errorf("--state: %w", err)
	}
	bw, err := parseRate(*bandwidth)
	if err != nil {
		return fmt.Errorf("--bandwidth: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the cairn binary to run the job with: %w", err)
	}
	_, err = drill.Run(ctx, drill.Config{
		StateBytes: size, Change: *change, Slots: *slots, RescaleTo: *rescale, Store: *store, Bandwidth: bw,
		Chain: *chain, ValueBytes: *valueBytes, Out: *out, WorkDir: *work, Binary: exe, Seed: *seed, Repeat: *repeat, Graph: *graph,
		Stdout: stdout, Progress: stderr, TTY: cmdline.IsTerminal(stderr), Logger: cmdline.NewLogger(stderr, *logLevel),
	})
	return err
}

// parseRate reads a bandwidth: a size (50MB, 8MiB), optionally with "/s".
func parseRate(s string) (int64, error) {
	if len(s) > 2 && s[len(s)-2:] == "/s" {
		s = s[:len(s)-2]
	}
	return job.ParseBytes(s)
}
