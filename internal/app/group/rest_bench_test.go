package group

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"cairn/internal/testutil/natscluster"

	"github.com/nats-io/nats.go/jetstream"
)

var (
	restMembers = flag.String("cairn.group.members", "3,10,30", "group sizes BenchmarkGroupAtRest measures")
	restWindow  = flag.Duration("cairn.group.window", 15*time.Second, "how long BenchmarkGroupAtRest measures each group at rest")
	restTTL     = flag.Duration("cairn.group.ttl", 3*time.Second, "lease TTL in BenchmarkGroupAtRest")
	restKG      = flag.Int("cairn.group.kg", 128, "key groups of the one sub-topology in BenchmarkGroupAtRest")
)

// BenchmarkGroupAtRest measures the KV load a settled group puts on a
// three-node cluster (R3 bucket): lease renewals and the watch deliveries
// they cause, counted by the members and checked against the bucket
// stream's sequence; then one member joins and the benchmark reports how
// long the group took to settle again and how many compare-and-set
// conflicts the handoffs met.
//
//	go test ./internal/app/group -run '^$' -bench GroupAtRest -benchtime 1x
func BenchmarkGroupAtRest(b *testing.B) {
	c := natscluster.Start(b)
	for _, s := range strings.Split(*restMembers, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("-cairn.group.members: %q", s)
		}
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			for i := range b.N {
				atRest(b, c, fmt.Sprintf("rest%d-%d", n, i), n)
			}
		})
	}
}

func atRest(b *testing.B, c *natscluster.Cluster, job string, n int) {
	js, err := jetstream.New(c.Connect())
	if err != nil {
		b.Fatal(err)
	}
	f := &fixture{tb: b, c: c, js: js, job: job, ttl: *restTTL, subs: []SubTopology{{Name: "src", KeyGroups: *restKG}}}
	var apps []*app
	for i := range n {
		apps = append(apps, f.join(fmt.Sprintf("m%03d", i)))
	}
	f.settled(apps...)
	ctx := context.Background()
	stream, err := js.Stream(ctx, "KV_"+Bucket(job))
	if err != nil {
		b.Fatal(err)
	}
	sum := func() Stats {
		var s Stats
		for _, a := range apps {
			x := a.m.Stats()
			s.Writes += x.Writes
			s.Reads += x.Reads
			s.WatchUpdates += x.WatchUpdates
			s.Conflicts += x.Conflicts
		}
		return s
	}
	info0, err := stream.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	s0, t0 := sum(), time.Now()
	time.Sleep(*restWindow)
	info1, err := stream.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	s1, d := sum(), time.Since(t0).Seconds()
	b.ReportMetric(float64(s1.Writes-s0.Writes)/d, "kv-writes/s")
	b.ReportMetric(float64(s1.Reads-s0.Reads)/d, "kv-reads/s")
	b.ReportMetric(float64(s1.WatchUpdates-s0.WatchUpdates)/d, "watch-deliveries/s")
	b.ReportMetric(float64(info1.State.LastSeq-info0.State.LastSeq)/d, "stream-msgs/s")

	// One more member: handoffs from every owner to it.
	c0 := sum().Conflicts
	j0 := time.Now()
	apps = append(apps, f.join(fmt.Sprintf("m%03d", n)))
	f.settled(apps...)
	b.ReportMetric(time.Since(j0).Seconds()*1000, "join-settle-ms")
	b.ReportMetric(float64(sum().Conflicts-c0), "join-conflicts")
	for _, a := range apps {
		a.m.Close()
	}
}
