package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"cairn/checkpoint"
	"cairn/internal/app/cmdline"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/recovery"
	"cairn/recovery/model"
)

// cmdStandby follows a job's checkpoint store and keeps a warm local copy
// of the newest checkpoints, so a failover downloads only the last delta.
func cmdStandby(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("standby", "cairn standby --job FILE [--cache DIR] [--store URL] [--poll 1s]", stderr)
	jobFile := fs.String("job", "", "the job file of the primary")
	cache := fs.String("cache", "", "cache directory (default: <data_dir>/standby)")
	storeFlag := fs.String("store", "", "checkpoint store URL (overrides checkpoint.store:)")
	poll := fs.Duration("poll", time.Second, "how often to look for new checkpoints")
	report := fs.Duration("report", 5*time.Second, "how often to print how far behind the standby is")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	j, err := loadJob(fs, *jobFile, Overrides{Store: *storeFlag})
	if err != nil {
		return err
	}
	if j.Checkpoint == nil {
		return &job.Error{Field: "checkpoint", Reason: "a standby follows the checkpoint store: configure checkpoint.store or pass --store"}
	}
	if *cache == "" {
		*cache = filepath.Join(j.DataDir, "standby")
	}
	u, err := runtime.StoreURL(j)
	if err != nil {
		return err
	}
	store, err := checkpoint.OpenStore(ctx, u)
	if err != nil {
		return err
	}
	defer store.Close(context.Background())
	log := cmdline.NewLogger(stderr, *logLevel)
	sb := recovery.NewStandby(store, j.Name, *cache, log)
	// The syncs are this node's measured downloads from the store: the
	// restore model of the data directory calibrates from them, so a
	// failover here is predicted with this node's bandwidth.
	mod := model.Load(j.DataDir)
	sb.OnSync = func(t model.Transfer) {
		if err := mod.ObserveTransfer(t); err != nil {
			log.Warn("standby: record the sync in the restore model", "err", err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- sb.Run(ctx, *poll) }()
	tick := time.NewTicker(*report)
	defer tick.Stop()
	fmt.Fprintf(stdout, "standby: following %s job %s into %s; fail over with: cairn run --job %s --standby-cache %s\n", runtime.RedactURL(u), j.Name, *cache, *jobFile, *cache)
	for {
		select {
		case err := <-done:
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		case <-tick.C:
			l := sb.Lag()
			fmt.Fprintf(stdout, "standby: synced checkpoint %d, latest %d, %d checkpoints and %s behind\n", l.LastSynced, l.Latest, l.CheckpointsBehind, runtime.FormatBytes(uint64(max(l.BytesBehind, 0))))
		}
	}
}
