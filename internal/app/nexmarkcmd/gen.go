// Package nexmarkcmd is `cairn nexmark`: gen publishes the Nexmark events
// to JetStream, bench runs the queries of examples/nexmark in process and
// prints their throughput beside Flink's and RisingWave's published figures.
package nexmarkcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/nexmark"
)

// GenConfig is what `cairn nexmark gen` publishes.
type GenConfig struct {
	Nexmark nexmark.Config
	// Stream is the JetStream stream, created with the subjects
	// Subject.> when missing.
	Stream string
	// Subject is the subjects' prefix: events go to
	// <Subject>.<kind>.<key> (key: person id, auction id, a bid's auction).
	Subject string
	// PublishRate bounds the publishing in events per wall-clock second
	// (0: as fast as the server takes them).
	PublishRate int
}

// maxPending is how many publishes may await their acknowledgement.
const maxPending = 4096

// Gen publishes cfg.Nexmark.Events events (which must be bounded) to the
// stream on nc, each with its event time in Cairn-Time (the stream's own
// timestamp is the publish time), and prints the count and the rate.
func Gen(ctx context.Context, nc *nats.Conn, cfg GenConfig, stdout io.Writer) error {
	if cfg.Nexmark.Events == 0 {
		return errors.New("nexmark gen: --events must be at least 1")
	}
	g, err := nexmark.New(cfg.Nexmark)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(maxPending))
	if err != nil {
		return err
	}
	if _, err := js.Stream(ctx, cfg.Stream); errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{cfg.Subject + ".>"}, Storage: jetstream.FileStorage}); err != nil {
			return fmt.Errorf("nexmark gen: create stream %s: %w", cfg.Stream, err)
		}
	} else if err != nil {
		return fmt.Errorf("nexmark gen: stream %s: %w", cfg.Stream, err)
	}
	start := time.Now()
	var e nexmark.Event
	var futures []jetstream.PubAckFuture
	// settle waits for every publish issued so far; one that failed
	// stops the run with its event.
	settle := func() error {
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return fmt.Errorf("nexmark gen: publish %s: %w", f.Msg().Subject, err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		futures = futures[:0]
		return nil
	}
	for n := uint64(0); n < cfg.Nexmark.Events; n++ {
		if cfg.PublishRate > 0 && n%100 == 0 {
			due := start.Add(time.Duration(float64(n) / float64(cfg.PublishRate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		g.Event(n, &e)
		m := &nats.Msg{
			Subject: cfg.Subject + "." + e.Kind.String() + "." + strconv.FormatInt(e.Key(), 10),
			Header:  nats.Header{engine.HeaderTime: []string{strconv.FormatInt(e.Time(), 10)}},
			Data:    nexmark.AppendJSON(nil, &e),
		}
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			return fmt.Errorf("nexmark gen: publish event %d: %w", n, err)
		}
		if futures = append(futures, f); len(futures) == maxPending {
			if err := settle(); err != nil {
				return err
			}
		}
	}
	if err := settle(); err != nil {
		return err
	}
	el := time.Since(start)
	fmt.Fprintf(stdout, "published %d events (seed %d, event time %d to %d) to %s in %.1fs: %.0f events/s\n",
		cfg.Nexmark.Events, g.Config().Seed, g.Config().Time(0), g.Config().Time(cfg.Nexmark.Events-1), cfg.Stream, el.Seconds(), float64(cfg.Nexmark.Events)/el.Seconds())
	return nil
}
