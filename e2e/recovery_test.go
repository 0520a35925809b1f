package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/recovery"
)

const rescaleJob = `
name: rescale
nats: %s
input:  {stream: EVENTS, subjects: ["events.>"]}
stages:
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: COUNTS, subject: counts, delivery: exactly_once}
key_groups: 64
slots: %d
data_dir: %s
checkpoint: {store: "%s", interval: 1h, mode: %s}
`

func publishKeyed(t *testing.T, url string, from, to int, model map[string]int) {
	_, js := connectJS(t, url)
	var msgs []*nats.Msg
	for i := from; i < to; i++ {
		k := fmt.Sprintf("user-%d", (i*17)%301)
		model[k]++
		msgs = append(msgs, &nats.Msg{Subject: "events.x", Header: nats.Header{engine.HeaderKey: []string{k}}, Data: []byte("x")})
	}
	publishAll(t, js, msgs)
}

func startJob(t *testing.T, yaml string, ro runtime.Options) (*runtime.Running, error) {
	j, err := job.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return runtime.Start(context.Background(), j, ro, testLogger(t))
}

// TestRescaleContinuesExactly: run at 2 slots, stop (the stop takes a
// checkpoint), restart at 3 and then at 1 slot with more input each time,
// both modes; counts stay exact in the output and in the state, and the
// output indexes stay gap-free per key group across the rescales.
func TestRescaleContinuesExactly(t *testing.T) {
	for _, mode := range []string{"incremental", "full"} {
		t.Run(mode, func(t *testing.T) {
			url := startNATS(t)
			_, js := connectJS(t, url)
			createStream(t, js, "EVENTS", "events.>")
			store := "file://" + t.TempDir() + "?create_dir=true"
			data := t.TempDir()
			model := map[string]int{}
			seq := 0
			for _, slots := range []int{2, 3, 1} {
				publishKeyed(t, url, seq, seq+3000, model)
				seq += 3000
				r, stop := runJob(t, fmt.Sprintf(rescaleJob, url, slots, data, store, mode))
				if slots != 2 && (r.Restored == nil || !r.Restored.Rescaled) {
					t.Fatalf("restart at %d slots did not restore rescaled: %+v", slots, r.Restored)
				}
				waitProcessed(t, r.Engine, uint64(seq))
				if err := stop(); err != nil {
					t.Fatal(err)
				}
			}
			checkOutputs(t, js, "COUNTS", "counts", 64, model)
			checkState(t, data, 64, 1, model)
		})
	}
}

// TestSavepointRestoreAndRefusals: a savepoint taken through the control
// action restores onto another slot count; a job with another key_groups
// is refused before any input is read, leaving the data directory as it was.
func TestSavepointRestoreAndRefusals(t *testing.T) {
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "EVENTS", "events.>")
	store := "file://" + t.TempDir() + "?create_dir=true"
	data := t.TempDir()
	model := map[string]int{}
	publishKeyed(t, url, 0, 2000, model)
	r, stop := runJob(t, fmt.Sprintf(rescaleJob, url, 2, data, store, "incremental"))
	waitProcessed(t, r.Engine, 2000)
	id, ok := r.Engine.TriggerCheckpoint(context.Background(), engine.CheckpointRequest{Savepoint: "before-upgrade"})
	if !ok {
		t.Fatal("savepoint not triggered")
	}
	if ev, err := r.Engine.WaitCheckpoint(context.Background(), id); err != nil || ev.Err != nil {
		t.Fatalf("savepoint: %v %v", err, ev.Err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// Refusal: another key_groups. The data directory must not change.
	before := treeDigest(t, data)
	bad := strings.Replace(fmt.Sprintf(rescaleJob, url, 2, data, store, "incremental"), "key_groups: 64", "key_groups: 32", 1)
	if _, err := startJob(t, bad, runtime.Options{}); !errors.Is(err, recovery.ErrKeyGroupsMismatch) {
		t.Fatalf("restore with other key_groups: got %v, want ErrKeyGroupsMismatch", err)
	}
	if after := treeDigest(t, data); after != before {
		t.Fatalf("a refused restore changed the data directory")
	}
	// Refusal: a savepoint that does not exist.
	if _, err := startJob(t, fmt.Sprintf(rescaleJob, url, 2, data, store, "incremental"), runtime.Options{Restore: "savepoint:nope"}); err == nil {
		t.Fatal("restore of a missing savepoint succeeded")
	}
	if after := treeDigest(t, data); after != before {
		t.Fatalf("a refused restore changed the data directory")
	}

	// More input; then restore the savepoint at 4 slots: the input after
	// the savepoint is processed again, and exactly-once output skips what
	// the stream already holds.
	publishKeyed(t, url, 2000, 3000, model)
	j, err := job.Parse([]byte(fmt.Sprintf(rescaleJob, url, 4, data, store, "incremental")))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := runtime.Start(context.Background(), j, runtime.Options{Restore: "savepoint:before-upgrade"}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if r2.Restored == nil || r2.Restored.Savepoint != "before-upgrade" || r2.StartSeq != 2001 {
		r2.Close()
		t.Fatalf("restored %+v, start seq %d", r2.Restored, r2.StartSeq)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r2.Engine.Run(ctx) }()
	waitProcessed(t, r2.Engine, 3000)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r2.Close()
	checkOutputs(t, js, "COUNTS", "counts", 64, model)
}

// treeDigest summarises a directory tree: names, sizes and modes.
func treeDigest(t *testing.T, root string) string {
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.Contains(p, string(os.PathSeparator)+"nats"+string(os.PathSeparator)) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() { // a temp dir made and removed changes the parent's mtime only
			fmt.Fprintf(&b, "%s dir\n", strings.TrimPrefix(p, root))
			return nil
		}
		fmt.Fprintf(&b, "%s %d %v %d\n", strings.TrimPrefix(p, root), info.Size(), info.Mode(), info.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
