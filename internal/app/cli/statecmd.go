package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/cmdline"
	"cairn/internal/app/runtime"
	"cairn/internal/base/datadir"
	"cairn/recovery"
	"cairn/state"
)

// cmdState reads a keyed stage's state from a checkpoint or savepoint in a
// store, the read side of Flink's State Processor API:
//
//	cairn state get KEY [--sub SUB] ...
//	cairn state scan [PREFIX] ...
//
// It restores the checkpoint into a temporary directory (one slot), then
// reads the key's values (get: every sub-key of the key, or one) or every
// key with the prefix (scan).
func cmdState(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "cairn state get KEY|scan [PREFIX] [--checkpoint ID|savepoint:NAME] [--sub SUB] [--json] (--store URL --job NAME | --job-file FILE)\n       cairn state export|import|migrate|diff ... (cairn state export -h)"
	if len(args) > 0 && isStateTool(args[0]) {
		return cmdStateTool(ctx, args, stdout, stderr)
	}
	if len(args) == 0 || (args[0] != "get" && args[0] != "scan") {
		fmt.Fprintln(stderr, "Usage:", usage)
		return errors.New("state get or state scan")
	}
	sub := args[0]
	fs := cmdline.NewFlagSet("state "+sub, usage, stderr)
	sf := addStoreFlags(fs)
	which := fs.String("checkpoint", "latest", "the checkpoint: latest, an id, or savepoint:NAME")
	subKey := fs.String("sub", "", "get: only this sub-key")
	asJSON := fs.Bool("json", false, "JSON lines")
	pos, err := cmdline.ParseInterspersed(fs, args[1:])
	if err != nil {
		return err
	}
	if sub == "get" && len(pos) != 1 {
		fs.Usage()
		return errors.New("state get: name one KEY")
	}
	if _, err := sf.resolve(fs); err != nil {
		return err
	}
	store, err := checkpoint.OpenStore(ctx, *sf.store)
	if err != nil {
		return err
	}
	defer store.Close(ctx)
	m, err := recovery.Select(ctx, store, *sf.job, *which)
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	tmp, err := os.MkdirTemp("", "cairn-state-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if _, err := recovery.Restore(ctx, m, recovery.Options{Store: store, Job: *sf.job, KeyGroups: m.KeyGroups, Slots: 1, DataDir: tmp,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		return fmt.Errorf("state: restore checkpoint %d: %w", m.ID, err)
	}
	all := state.KeyGroupRange{First: 0, Last: m.KeyGroups - 1}
	db, err := state.Open(datadir.Slot(tmp, 0), state.Options{KeyGroups: m.KeyGroups, Range: all, ReadOnly: true})
	if err != nil {
		return err
	}
	defer db.Close()
	print := func(key, sub, value []byte) {
		if *asJSON {
			b, _ := json.Marshal(map[string]string{"key": string(key), "sub": string(sub), "value": string(value)})
			fmt.Fprintln(stdout, string(b))
			return
		}
		if len(sub) > 0 {
			fmt.Fprintf(stdout, "%s %s = %s\n", strconv.Quote(string(key)), strconv.Quote(string(sub)), strconv.Quote(string(value)))
			return
		}
		fmt.Fprintf(stdout, "%s = %s\n", strconv.Quote(string(key)), strconv.Quote(string(value)))
	}
	n := 0
	if sub == "get" {
		key := []byte(pos[0])
		kg := state.KeyGroup(key, m.KeyGroups)
		if *subKey != "" {
			v, ok, err := db.Get(engine.KeyedStageID, kg, key, []byte(*subKey))
			if err != nil {
				return err
			}
			if ok {
				print(key, []byte(*subKey), v)
				n++
			}
		} else if err := db.Scan(engine.KeyedStageID, kg, key, nil, func(sub, v []byte) error {
			print(key, sub, v)
			n++
			return nil
		}); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("state: key %q has no state in checkpoint %d", pos[0], m.ID)
		}
		return nil
	}
	prefix := ""
	if len(pos) > 0 {
		prefix = pos[0]
	}
	err = runtime.KeyedValues(db, all, func(key, sub, val []byte) error {
		if strings.HasPrefix(string(key), prefix) {
			print(key, sub, val)
			n++
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%d entries in checkpoint %d (source_seq %d)\n", n, m.ID, m.SourceSeq)
	return nil
}
