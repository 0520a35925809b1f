package natscluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"cairn/internal/testutil/testbin"

	"github.com/nats-io/nats.go/jetstream"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// TestClusterR3 shows that R3 streams and KV buckets work on the cluster and
// survive their leader being killed, restarted, paused and resumed.
func TestClusterR3(t *testing.T) {
	c := Start(t)
	nc := c.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "t", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.Stream(ctx, "KV_t")
	if err != nil {
		t.Fatal(err)
	}
	si, err := info.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if si.Config.Replicas != 3 || si.Cluster == nil || len(si.Cluster.Replicas) != 2 {
		t.Fatalf("KV stream not R3: replicas %d, cluster %+v", si.Config.Replicas, si.Cluster)
	}
	if _, err := kv.Put(ctx, "k", []byte("1")); err != nil {
		t.Fatal(err)
	}

	leader := c.WaitStreamLeader(js, "KV_t", -1, 30*time.Second)
	t0 := time.Now()
	c.Kill(leader)
	next := c.WaitStreamLeader(js, "KV_t", leader, 60*time.Second)
	if next == leader {
		t.Fatalf("leader %d still leads after being killed", leader)
	}
	putEventually(t, ctx, kv, "k", "2")
	t.Logf("killed leader %s: new leader %s, put after %v", c.Name(leader), c.Name(next), time.Since(t0))
	t0 = time.Now()
	c.Restart(leader)
	t.Logf("restarted %s healthy after %v", c.Name(leader), time.Since(t0))

	// A paused leader stops answering: the others elect a new one, and the
	// resumed node rejoins as a follower.
	leader = c.WaitStreamLeader(js, "KV_t", -1, 30*time.Second)
	t0 = time.Now()
	c.Pause(leader)
	c.WaitStreamLeader(js, "KV_t", leader, 60*time.Second)
	putEventually(t, ctx, kv, "k", "3")
	t.Logf("paused leader %s: put after %v", c.Name(leader), time.Since(t0))
	c.Resume(leader)
	c.WaitHealthy(leader, 60*time.Second)

	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "3" {
		t.Fatalf("after failover: %v %v", e, err)
	}
	if _, err := c.StreamLeader(ctx, js, "no-such-stream"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("leader of a missing stream: %v", err)
	}
}

// putEventually retries a put while the cluster elects a new leader.
func putEventually(t *testing.T, ctx context.Context, kv jetstream.KeyValue, k, v string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := kv.Put(pctx, k, []byte(v))
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(fmt.Errorf("put %s after failover: %w", k, err))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
