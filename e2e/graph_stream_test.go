package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/cli"
	"cairn/internal/app/job"
	"cairn/internal/testutil/wait"
)

// TestJobGraphRepartitionStreamDeleted deletes a running graph's
// repartition stream: the job stops with an error naming the stream; a
// restart refuses, naming the stream and the checkpoints that need it,
// and leaves it uncreated; a restart with --restore none then reprocesses
// the input into a fresh stream and the output is exactly the model's (the
// windows published before the deletion are skipped, not repeated). A
// stream purged outside cairn is refused the same way.
func TestJobGraphRepartitionStreamDeleted(t *testing.T) {
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "LINES", "lines.>")
	data, store := t.TempDir(), "file://"+t.TempDir()+"?create_dir=true"
	j, err := job.Parse([]byte(topWordsJob(t, url, data, store, 2)))
	if err != nil {
		t.Fatal(err)
	}
	in := &lineInput{t: t, js: js, rng: rand.New(rand.NewPCG(7, 7)), step: 7}
	in.publish(600)
	ctx := context.Background()

	r, err := cli.Start(ctx, j, cli.RunOptions{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitProcessed(t, r.Engine, uint64(len(in.lines)))
	wait.Until(t, time.Minute, "a checkpoint of each sub-topology after the input", func() error {
		for _, s := range append([]*cli.Running{r}, r.Downstream...) {
			if st := s.Engine.Stats(); st.Checkpoints < 2 || st.ProcessedSeq == 0 {
				return fmt.Errorf("%s: %+v", s.Job.Name, st)
			}
		}
		return nil
	})
	if err := js.DeleteStream(ctx, "CAIRN_RP_TOPWORDS_1"); err != nil {
		t.Fatal(err)
	}
	in.publish(200)
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the job kept running for a minute without its repartition stream")
	}
	r.Close()
	if !errors.Is(runErr, engine.ErrStreamDeleted) || !strings.Contains(runErr.Error(), "CAIRN_RP_TOPWORDS_1") {
		t.Fatalf("run error %v, want ErrStreamDeleted naming the repartition stream", runErr)
	}
	t.Logf("running job stopped: %v", runErr)

	// A restart refuses and creates nothing.
	_, err = cli.Start(ctx, j, cli.RunOptions{}, testLogger(t))
	var re *cli.RepartitionError
	if !errors.As(err, &re) || re.Stream != "CAIRN_RP_TOPWORDS_1" {
		t.Fatalf("restart: %v, want a RepartitionError naming the stream", err)
	}
	t.Logf("restart refused: %v", err)
	if _, err := js.Stream(ctx, "CAIRN_RP_TOPWORDS_1"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("the refused restart left the stream behind: %v", err)
	}

	// --restore none: everything again from the first input message.
	r, err = cli.Start(ctx, j, cli.RunOptions{Restore: "none"}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done = make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	waitProcessed(t, r.Engine, uint64(len(in.lines)))
	in.closeWindows()
	model := topWordsModel(in.lines, in.times, in.times[len(in.times)-1])
	wait.Until(t, time.Minute, fmt.Sprintf("%d closed windows on TOP", len(model)), func() error {
		if n := len(readStream(t, js, "TOP", 0)); n < len(model) {
			return fmt.Errorf("%d outputs", n)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.Close()
	checkTopWords(t, js, model)

	// Purged outside cairn while stopped: the key groups' last messages
	// (the restored upstream's skip points) are gone, so a restart refuses.
	st, err := js.Stream(ctx, "CAIRN_RP_TOPWORDS_1")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = cli.Start(ctx, j, cli.RunOptions{}, testLogger(t))
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "purged outside cairn") {
		t.Fatalf("restart after an outside purge: %v, want a RepartitionError", err)
	}
}
