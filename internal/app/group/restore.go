package group

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"cairn/checkpoint"
	"cairn/internal/app/runtime"

	"github.com/nats-io/nats.go/jetstream"
)

// A group restores a savepoint when it starts: the first member is started
// with --restore savepoint:NAME. It records in the group's bucket, for
// every sub-topology, that its next start restores that savepoint's part
// (key restore.<k>), whichever member it is given to. The record stays
// until a checkpoint taken after that restore has committed: only then
// does "the newest checkpoint" descend from the savepoint, so a member that
// dies before it leaves the next owner to restore the savepoint again, not
// the chain from before it.

// keyRestorePre + k names the savepoint sub-topology k restores when it
// next starts.
const keyRestorePre = "restore."

// ErrRestoreRunning is --restore savepoint:NAME given to a member of a
// group that runs: a savepoint is restored when the group starts.
var ErrRestoreRunning = errors.New("group: a savepoint is restored when the group starts, not into a running group")

// requestRestore records that every sub-topology of the plan restores
// savepoint name at its next start. Refused while another member holds a
// lease, and when the savepoint lacks a sub-topology's part.
func requestRestore(ctx context.Context, js jetstream.JetStream, cfg Config, plan *runtime.Plan, name string) error {
	st, err := ReadStatus(ctx, js, cfg.Job)
	if err != nil && !errors.Is(err, ErrNoGroup) {
		return err
	}
	for _, m := range st.Members {
		if m.ID != cfg.Member {
			return fmt.Errorf("%w: member %s holds a lease; stop every member, then start the first one with --restore savepoint:%s", ErrRestoreRunning, m.ID, name)
		}
	}
	u, err := runtime.StoreURL(plan.Job)
	if err != nil {
		return err
	}
	store, err := checkpoint.OpenStore(ctx, u)
	if err != nil {
		return fmt.Errorf("group: --restore savepoint:%s: open the store: %w", name, err)
	}
	defer store.Close(ctx)
	for k := range plan.Subs {
		if _, err := checkpoint.LoadSavepoint(ctx, store, plan.SubName(k), name); err != nil {
			return fmt.Errorf("group: --restore savepoint:%s: sub-topology %s: %w", name, plan.SubName(k), err)
		}
	}
	if err := cfg.check(); err != nil {
		return err
	}
	kv, err := openBucket(ctx, js, cfg)
	if err != nil {
		return err
	}
	for k := range plan.Subs {
		if _, err := kv.Put(ctx, keyRestorePre+strconv.Itoa(k), []byte(name)); err != nil {
			return fmt.Errorf("group: record the restore of savepoint %s: %w", name, err)
		}
	}
	cfg.Log.Info("group: every sub-topology restores savepoint "+name+" when it next starts", "job", cfg.Job)
	return nil
}

// pendingRestore is a savepoint a sub-topology restores, and the record's
// revision.
type pendingRestore struct {
	name string
	rev  uint64
}

// pendingRestores reads which of subs restore a savepoint at this start.
func (r *runner) pendingRestores(ctx context.Context, subs []int) (map[int]pendingRestore, error) {
	out := map[int]pendingRestore{}
	for _, k := range subs {
		e, err := r.m.kv.Get(ctx, keyRestorePre+strconv.Itoa(k))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("group: read %s%d: %w", keyRestorePre, k, err)
		}
		out[k] = pendingRestore{name: string(e.Value()), rev: e.Revision()}
	}
	return out, nil
}

// clearRestores removes each pending record once the sub-topology that
// restored the savepoint has committed a checkpoint since (the newest
// checkpoint then descends from the savepoint), until ctx ends.
func (r *runner) clearRestores(ctx context.Context, run *runtime.Running, pending map[int]pendingRestore) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for len(pending) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for k, p := range pending {
			var sub *runtime.Running
			for _, s := range run.SubTopologies() {
				if s.Job.Name == r.plan.SubName(k) {
					sub = s
				}
			}
			if sub == nil || sub.Store == nil {
				delete(pending, k)
				continue
			}
			st := sub.Engine.Stats()
			if st.Checkpoints == 0 {
				continue
			}
			// A savepoint counts among the engine's checkpoints, but only
			// a checkpoint is what a later start restores.
			ids, err := checkpoint.ManifestIDs(ctx, sub.Store, sub.Job.Name)
			if err != nil || !slices.Contains(ids, st.LastChkID) {
				continue
			}
			err = r.m.kv.Delete(ctx, keyRestorePre+strconv.Itoa(k), jetstream.LastRevision(p.rev))
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				// Recorded anew since (another restore asked for): that
				// one is its start's to clear.
				if e, gerr := r.m.kv.Get(ctx, keyRestorePre+strconv.Itoa(k)); errors.Is(gerr, jetstream.ErrKeyNotFound) || (gerr == nil && e.Revision() != p.rev) {
					delete(pending, k)
					continue
				}
				r.log.Warn("group: clear the restore of a savepoint", "sub_topology", sub.Job.Name, "savepoint", p.name, "err", err)
				continue
			}
			r.log.Info("group: restored savepoint checkpointed: later starts restore the newest checkpoint", "sub_topology", sub.Job.Name, "savepoint", p.name, "checkpoint", st.LastChkID)
			delete(pending, k)
		}
	}
}
