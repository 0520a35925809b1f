package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/base/datadir"
	"cairn/internal/base/natsembed"
)

// The demo's streams and their bounds. The input keeps what no retained
// checkpoint has consumed (it is purged below the oldest one's position) and
// refuses new lines rather than dropping unread ones when full; the output
// is purged behind the demo's verifier, keeping each key group's last output
// (the exactly-once sink's restart point). The byte limits are a backstop
// the purges keep the streams far below.
const (
	demoInputStream   = "LINES"
	demoInputSubject  = "lines.>"
	demoOutputStream  = "COUNTS"
	demoOutputSubject = "counts"
	demoKeyGroups     = 128
	demoInputBytes    = 256 << 20
	demoOutputBytes   = 1 << 30
	// demoOutputAge bounds the output by age too: far beyond any pause of a
	// workshop, so a key group's last output (the sink's restart point) is
	// never aged out under a running demo.
	demoOutputAge = 7 * 24 * time.Hour
	// defaultNATSPort is the port the demo tries first (NATS's own default),
	// so that a presenter's `nats` commands need no -s.
	defaultNATSPort = 4222
)

// demoMemory is what a demo remembers in its data directory across restarts.
type demoMemory struct {
	// NATSPort is the embedded server's port: the same on every restart.
	NATSPort int `json:"nats_port"`
	// Slots is the job's slot count after the last rescale.
	Slots int `json:"slots"`
	// Seed is the bulk-loaded checkpoint's id (0: none).
	Seed uint64 `json:"seed_checkpoint,omitempty"`
}

func demoMemoryPath(dir string) string { return filepath.Join(dir, "demo.json") }

func loadDemoMemory(dir string) demoMemory {
	var m demoMemory
	if b, err := os.ReadFile(demoMemoryPath(dir)); err == nil {
		_ = json.Unmarshal(b, &m)
	}
	return m
}

func saveDemoMemory(dir string, m demoMemory) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return datadir.WriteFileAtomic(demoMemoryPath(dir), append(b, '\n'))
}

// natsHint ends the error of an embedded server that cannot start.
const natsHint = "the embedded server keeps its streams under the data directory; fix that directory or choose another with --data"

// startDemoNATS starts the embedded server on the port given (flag), else the
// one remembered, else 4222; when that port is taken, on a random one. It
// returns the server and whether it fell back.
func startDemoNATS(dir string, want int, jsMemory int64) (*natsembed.Server, bool, error) {
	if want == 0 {
		want = defaultNATSPort
	}
	srv, err := natsembed.Start(natsembed.Options{Dir: dir, Port: want, JSMemory: jsMemory, Hint: natsHint})
	if err == nil {
		return srv, false, nil
	}
	srv, err2 := natsembed.Start(natsembed.Options{Dir: dir, JSMemory: jsMemory, Hint: natsHint})
	if err2 != nil {
		return nil, false, fmt.Errorf("%w (and on port %d: %v)", err2, want, err)
	}
	return srv, true, nil
}

// ensureDemoStreams creates the input and output streams with the demo's
// bounds and replicas (1 on the one embedded server, 3 on the group demo's
// cluster), or puts the bounds on streams an earlier demo left.
func ensureDemoStreams(ctx context.Context, js jetstream.JetStream, replicas int) error {
	for _, sc := range []jetstream.StreamConfig{
		{Name: demoInputStream, Subjects: []string{demoInputSubject}, Storage: jetstream.FileStorage,
			MaxBytes: demoInputBytes, Discard: jetstream.DiscardNew, Replicas: replicas},
		{Name: demoOutputStream, Subjects: []string{demoOutputSubject + ".>"}, Storage: jetstream.FileStorage,
			MaxBytes: demoOutputBytes, MaxAge: demoOutputAge, AllowBatchPublish: true, Replicas: replicas},
	} {
		if _, err := engine.CreateOrUpdateStream(ctx, js, sc, nil); err != nil {
			return fmt.Errorf("demo: stream %s: %w", sc.Name, err)
		}
	}
	return nil
}

// purgeDemoStreams applies the demo's retention: the input below both the
// oldest retained checkpoint's position and the verifier's saved one, and
// each key group's outputs below the verifier's saved position but its last.
func purgeDemoStreams(ctx context.Context, js jetstream.JetStream, store checkpoint.Store, job string, verified verifyPos) error {
	list, err := checkpoint.List(ctx, store, job)
	if err != nil {
		return err
	}
	if len(list) > 0 {
		keep := verified.Input
		for _, e := range list {
			if e.Corrupt == "" {
				keep = min(keep, e.SourceSeq)
			}
		}
		if keep > 1 {
			st, err := js.Stream(ctx, demoInputStream)
			if err != nil {
				return err
			}
			if err := st.Purge(ctx, jetstream.WithPurgeSequence(keep+1)); err != nil {
				return fmt.Errorf("demo: purge %s below %d: %w", demoInputStream, keep+1, err)
			}
		}
	}
	if verified.Output == 0 {
		return nil
	}
	st, err := js.Stream(ctx, demoOutputStream)
	if err != nil {
		return err
	}
	for kg := range demoKeyGroups {
		subj := demoOutputSubject + "." + strconv.Itoa(kg)
		last, err := st.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		// INVARIANT: the key group's last output stays: the sink reads it
		// to skip what a replay regenerates.
		upTo := min(verified.Output+1, last.Sequence)
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(upTo)); err != nil {
			return fmt.Errorf("demo: purge %s below %d: %w", subj, upTo, err)
		}
	}
	return nil
}

// generator publishes lines of the corpus at a rate (0: as fast as the job
// keeps up, within maxLag). It keeps no model: the verifier counts what the
// input stream holds.
type generator struct {
	js     jetstream.JetStream
	rate   int
	corpus *Corpus
	// lag is the current consumer lag (for rate 0).
	lag func() uint64
	// published counts publishes; rejected those the stream refused.
	published, rejected atomic.Uint64
}

func (g *generator) run(ctx context.Context) error {
	const maxLag = 50000
	const tick = 20 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	var sent uint64
	for ctx.Err() == nil {
		n := 0
		if g.rate > 0 {
			due := uint64(time.Since(start).Seconds() * float64(g.rate))
			n = int(min(due-min(due, sent), uint64(g.rate))) // at most a second's worth after a pause
			sent += uint64(n)
		} else if g.lag() < maxLag {
			n = 1000
		}
		for range n {
			line, _ := g.corpus.Line()
			if _, err := g.js.PublishMsgAsync(&nats.Msg{Subject: "lines.demo", Data: []byte(line)}, jetstream.WithStallWait(time.Second)); err != nil {
				g.rejected.Add(1)
				break
			}
			g.published.Add(1)
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	select {
	case <-g.js.PublishAsyncComplete():
		return nil
	case <-time.After(30 * time.Second):
		return errors.New("demo: publishes not acknowledged after 30s")
	}
}
