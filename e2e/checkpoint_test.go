package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/cli"
	"cairn/internal/app/demo"
	"cairn/internal/testutil/testservers"
)

const checkpointJob = wordcountJob + `checkpoint: {store: "%s", interval: 200ms, mode: %s, retain: 3}
`

// TestCheckpointsEndToEnd runs wordcount with checkpoints every 200 ms to a
// file store and to an S3-protocol server, in both modes; the final
// checkpoint taken after all input is processed must cover the whole input,
// verify clean, and `cairn checkpoints ls|show|verify|gc` must work on it.
// A corrupted object makes verify fail, naming it.
func TestCheckpointsEndToEnd(t *testing.T) {
	for _, tc := range []struct{ store, mode string }{
		{"file", "incremental"}, {"file", "full"}, {"s3", "incremental"},
	} {
		t.Run(tc.store+"-"+tc.mode, func(t *testing.T) {
			natsURL := startNATS(t)
			_, js := connectJS(t, natsURL)
			createStream(t, js, "LINES", "lines.>")
			var storeURL string
			root := t.TempDir()
			if tc.store == "file" {
				storeURL = "file://" + root + "?create_dir=true"
			} else {
				storeURL = testservers.StartGoFakeS3(t)
			}
			corpus := demo.NewCorpus(9, 1000)
			var msgs []*nats.Msg
			const lines = 4000
			for range lines {
				line, _ := corpus.Line()
				msgs = append(msgs, &nats.Msg{Subject: "lines.in", Data: []byte(line)})
			}
			publishAll(t, js, msgs)
			r, stop := runJob(t, fmt.Sprintf(checkpointJob, natsURL, "exactly_once", 2, t.TempDir(), storeURL, tc.mode))
			waitProcessed(t, r.Engine, lines)
			// A final checkpoint after everything is processed.
			ctx := context.Background()
			deadline := time.Now().Add(time.Minute)
			for {
				st := r.Engine.Stats()
				if st.LastChkSeq == lines {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no checkpoint covers seq %d: %+v", lines, st)
				}
				r.Engine.TriggerCheckpoint(ctx, engine.CheckpointRequest{})
				time.Sleep(50 * time.Millisecond)
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			for _, c := range r.Engine.Checkpoints() {
				if c.Err != nil {
					t.Errorf("checkpoint %d failed: %v", c.ID, c.Err)
				}
			}
			store, err := checkpoint.OpenStore(ctx, storeURL)
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close(ctx)
			list, err := checkpoint.List(ctx, store, "wordcount")
			if err != nil {
				t.Fatal(err)
			}
			if len(list) == 0 || len(list) > 3 {
				t.Fatalf("store holds %d checkpoints, want 1..3 (retain 3)", len(list))
			}
			latest := list[len(list)-1]
			if latest.SourceSeq != lines || string(latest.Mode) != tc.mode {
				t.Fatalf("latest checkpoint: seq %d mode %s, want %d %s", latest.SourceSeq, latest.Mode, lines, tc.mode)
			}
			m, err := checkpoint.Load(ctx, store, "wordcount", latest.ID)
			if err != nil {
				t.Fatal(err)
			}
			if m.SourceStream != "LINES" || len(m.Modules) != 2 || m.KeyGroups != 128 || m.SlotCount() != 2 {
				t.Fatalf("manifest: %+v", m)
			}

			run := func(args ...string) (string, int) {
				var out, errb bytes.Buffer
				code := cli.Main(append(args, "--store", storeURL, "--job", "wordcount"), &out, &errb)
				return out.String() + errb.String(), code
			}
			if out, code := run("checkpoints", "ls"); code != 0 || !strings.Contains(out, tc.mode) || !strings.Contains(out, "PREDICTED_RESTORE") {
				t.Fatalf("checkpoints ls: exit %d\n%s", code, out)
			}
			if out, code := run("checkpoints", "show", fmt.Sprint(latest.ID)); code != 0 || !strings.Contains(out, fmt.Sprintf("checkpoint %d", latest.ID)) || !strings.Contains(out, "through sequence") {
				t.Fatalf("checkpoints show: exit %d\n%s", code, out)
			}
			if out, code := run("checkpoints", "show", fmt.Sprint(latest.ID), "--json"); code != 0 || !strings.Contains(out, `"source_seq"`) {
				t.Fatalf("checkpoints show --json: exit %d\n%s", code, out)
			}
			var lsOut, lsErr bytes.Buffer
			if code := cli.Main([]string{"checkpoints", "ls", "--store", storeURL, "--job", "nosuchjob"}, &lsOut, &lsErr); code == 0 || !strings.Contains(lsErr.String(), "is the job name right") {
				t.Fatalf("ls of an unknown job: exit %d\n%s%s", code, lsOut.String(), lsErr.String())
			}
			// cairn state get: a word's count, read from the checkpoint.
			counts := map[string]int{}
			for _, m := range msgs {
				for _, w := range splitWords(string(m.Data)) {
					counts[w]++
				}
			}
			word := "the"
			for w, n := range counts {
				if n > counts[word] || counts[word] == 0 {
					word = w
				}
			}
			if out, code := run("state", "get", word); code != 0 || !strings.Contains(out, fmt.Sprintf(`%q = "%d"`, word, counts[word])) {
				t.Fatalf("cairn state get %s: exit %d, want count %d\n%s", word, code, counts[word], out)
			}
			if out, code := run("state", "scan", word[:1], "--json"); code != 0 || !strings.Contains(out, fmt.Sprintf(`"value":"%d"`, counts[word])) {
				t.Fatalf("cairn state scan: exit %d\n%s", code, out)
			}
			if out, code := run("checkpoints", "verify"); code != 0 {
				t.Fatalf("checkpoints verify: exit %d\n%s", code, out)
			}
			if out, code := run("checkpoints", "gc", "--dry-run"); code != 0 {
				t.Fatalf("checkpoints gc: exit %d\n%s", code, out)
			}
			if tc.store != "file" {
				return
			}
			// Flip a byte of the biggest object: verify must name it.
			var victim checkpoint.Object
			for _, o := range m.Objects {
				if o.Size > victim.Size {
					victim = o
				}
			}
			u, _ := url.Parse(storeURL)
			p := filepath.Join(u.Path, victim.Path)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0x40
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			out, code := run("checkpoints", "verify", fmt.Sprint(latest.ID))
			if code == 0 || !strings.Contains(out, victim.Path) {
				t.Fatalf("verify of a corrupted checkpoint: exit %d, output does not name %s:\n%s", code, victim.Path, out)
			}
		})
	}
}

// TestTransactionalDelivery: outputs become visible only when a checkpoint
// commits. With an interval of an hour nothing is published while the job
// runs; the checkpoint of the graceful stop publishes everything, exactly.
func TestTransactionalDelivery(t *testing.T) {
	natsURL := startNATS(t)
	_, js := connectJS(t, natsURL)
	createStream(t, js, "LINES", "lines.>")
	const lines = 1500
	msgs, model := lineCorpus(13, 300, lines)
	publishAll(t, js, msgs)
	job := strings.Replace(fmt.Sprintf(checkpointJob, natsURL, "transactional", 2, t.TempDir(), "file://"+t.TempDir()+"?create_dir=true", "incremental"), "interval: 200ms", "interval: 1h", 1)
	r, stop := runJob(t, job)
	waitProcessed(t, r.Engine, lines)
	time.Sleep(200 * time.Millisecond)
	s, err := js.Stream(context.Background(), "COUNTS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Fatalf("transactional: %d outputs visible before any checkpoint committed", info.State.Msgs)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkOutputs(t, js, "COUNTS", "counts", 128, model)
}
