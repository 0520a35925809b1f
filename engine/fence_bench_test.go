package engine

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// BenchmarkFencedPublish measures what fencing every output would cost the
// server: fast-batch publishes of outputs with the envelope headers, to 128
// key-group subjects of a file stream, without and with an epoch fence
// (Nats-Expected-Last-Subject-Sequence of a marker on a fence subject, which
// the server checks per message with a LoadLastMsg in its store loop). The
// fenced variant also checks that a newer marker makes the next publish
// fail. Run with -benchtime=1x; -cairn.fence.msgs sets the count.
//
//	go test ./engine -run '^$' -bench FencedPublish -benchtime 1x -count 3
func BenchmarkFencedPublish(b *testing.B) {
	for _, fenced := range []bool{false, true} {
		b.Run(map[bool]string{false: "unfenced", true: "fenced"}[fenced], func(b *testing.B) {
			for range b.N {
				benchFencedPublish(b, fenced, 300000)
			}
		})
	}
}

func benchFencedPublish(b *testing.B, fenced bool, n int) {
	b.StopTimer()
	nc := startServer(b)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>", "fence.out"}, Storage: jetstream.FileStorage, AllowBatchPublish: true}); err != nil {
		b.Fatal(err)
	}
	var epoch uint64
	if fenced {
		ack, err := js.Publish(ctx, "fence.out", []byte("writer-1"))
		if err != nil {
			b.Fatal(err)
		}
		epoch = ack.Sequence
	}
	subjects := make([]string, 128)
	for i := range subjects {
		subjects[i] = "out." + strconv.Itoa(i)
	}
	value := make([]byte, 8)
	b.StartTimer()
	t0 := time.Now()
	fp, err := jetstreamext.NewFastPublisher(js, jetstreamext.FastPublishFlowControl{Flow: batchFlow, MaxOutstandingAcks: batchMaxOutstandingAcks, AckTimeout: publishTimeout})
	if err != nil {
		b.Fatal(err)
	}
	h := nats.Header{HeaderKey: {""}, HeaderTime: {"1700000000000"}, HeaderOut: {""}}
	if fenced {
		h[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(epoch, 10)}
		h["Nats-Expected-Last-Subject-Sequence-Subject"] = []string{"fence.out"}
	}
	for i := range n {
		h[HeaderKey][0] = "key-" + strconv.Itoa(i%100000)
		h[HeaderOut][0] = strconv.Itoa(i/128 + 1)
		if _, err := fp.AddMsg(&nats.Msg{Subject: subjects[i%128], Header: h, Data: value}); err != nil {
			b.Fatal(err)
		}
	}
	ack, err := fp.Close(ctx)
	if err != nil || ack == nil || ack.BatchSize != uint64(n) {
		b.Fatalf("batch: %v %+v", err, ack)
	}
	d := time.Since(t0)
	b.StopTimer()
	b.ReportMetric(float64(n)/d.Seconds(), "msgs/s")
	if fenced {
		// A newer writer's marker fences the old one out.
		if _, err := js.Publish(ctx, "fence.out", []byte("writer-2")); err != nil {
			b.Fatal(err)
		}
		m := &nats.Msg{Subject: subjects[0], Header: h, Data: value}
		if _, err := js.PublishMsg(ctx, m); err == nil {
			b.Fatal(fmt.Errorf("a publish fenced on epoch %d was stored after a newer marker", epoch))
		}
	}
	b.StartTimer()
}
