package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/testutil/wait"
)

// BenchmarkGraphHop measures what one repartition hop costs, in one run over
// the same input (the Zipf keyed events of BenchmarkPipeline): the keyed
// count as one sub-topology (events in, counts out), then count -> count as
// a job graph of two (the second keyed by the key the first emitted, so each
// event is counted twice and crosses a persisted repartition stream once).
// events/s is input events through to the last sub-topology's output.
//
//	go test ./e2e -run '^$' -bench GraphHop -benchtime=1x -cairn.msgs=300000
func BenchmarkGraphHop(b *testing.B) {
	url := startNATS(b)
	_, js := connectJS(b, url)
	n := *benchMsgs
	keyedInput(b, js, n)
	for i, tc := range []struct {
		name   string
		stages []job.Stage
	}{
		{"one-sub-topology", []job.Stage{{Name: "count", Module: "builtin:count", Keyed: true, Deadline: &job.Duration{Off: true}}}},
		{"two-sub-topologies", []job.Stage{
			{Name: "count", Module: "builtin:count", Keyed: true, Deadline: &job.Duration{Off: true}},
			{Name: "again", Module: "builtin:count", Keyed: true, Deadline: &job.Duration{Off: true}},
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				out := fmt.Sprintf("HOP%d", i)
				j := &job.Job{Name: fmt.Sprintf("hop%d", i), NATS: url,
					Input:     job.Input{Stream: "EVENTS", Subjects: []string{"events.>"}},
					Stages:    tc.stages,
					Output:    job.Output{Stream: out, Subject: fmt.Sprintf("hop%d", i), Delivery: "exactly_once"},
					KeyGroups: 128, Slots: *benchSlots, DataDir: b.TempDir(), BatchSize: 512,
				}
				yaml, err := j.Marshal()
				if err != nil {
					b.Fatal(err)
				}
				pj, err := job.Parse(yaml)
				if err != nil {
					b.Fatal(err)
				}
				r, err := runtime.Start(context.Background(), pj, runtime.Options{}, testLogger(b))
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				stop := runStarted(b, r)
				wait.Until(b, 10*time.Minute, fmt.Sprintf("%d outputs on %s", n, out), func() error {
					s, err := js.Stream(context.Background(), out)
					if err != nil {
						return err
					}
					if got := s.CachedInfo().State.Msgs; got < uint64(n) {
						if info, err := s.Info(context.Background()); err == nil && info.State.Msgs >= uint64(n) {
							return nil
						}
						return fmt.Errorf("%d outputs", got)
					}
					return nil
				})
				el := time.Since(start)
				if err := stop(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(n)/el.Seconds(), "events/s")
			}
		})
	}
}
