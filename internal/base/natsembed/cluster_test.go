package natsembed

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestClusterR3 starts a three-node cluster in the process, creates an R3
// stream through one node, writes through another, stops the stream's
// leader and writes again through a survivor: the remaining two keep the
// stream and every message.
func TestClusterR3(t *testing.T) {
	c, err := StartCluster(ClusterOptions{Dir: t.TempDir(), Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	if n := len(c.Nodes()); n != 3 {
		t.Fatalf("%d nodes, want 3", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := js.Publish(ctx, "s.x", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream cluster %+v, want a leader and two replicas", info.Cluster)
	}
	leader := -1
	for i, n := range c.Nodes() {
		if n.srv.Name() == info.Cluster.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("leader %q is none of the nodes", info.Cluster.Leader)
	}
	c.Nodes()[leader].Shutdown()
	// The survivors elect a new leader; the publish retries until they do.
	// Each attempt has its own bound: a publish that reaches the stream
	// while it has no leader is dropped unanswered, and a wait on the
	// test's context would spend the whole minute on it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = js.Publish(actx, "s.x", []byte("after"), jetstream.WithMsgID("after"))
		acancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write after the leader stopped: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	info, err = st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 11 || info.Cluster.Leader == "" || info.Cluster.Leader == c.Nodes()[leader].srv.Name() {
		t.Fatalf("after the leader stopped: %d messages (want 11), leader %q", info.State.Msgs, info.Cluster.Leader)
	}
}

// TestClusterStoreTaken: a node that cannot create its store fails the
// start with ErrCluster, the node and the hint named.
func TestClusterStoreTaken(t *testing.T) {
	dir := t.TempDir()
	// A file where node 1's directory should be.
	if err := writeFile(dir+"/n1", "x"); err != nil {
		t.Fatal(err)
	}
	_, err := StartCluster(ClusterOptions{Dir: dir, Hint: "choose --data"})
	if !errors.Is(err, ErrCluster) {
		t.Fatalf("err %v, want ErrCluster", err)
	}
	if s := err.Error(); !contains(s, "node 1") || !contains(s, "choose --data") {
		t.Fatalf("err %q: want the node and the hint", s)
	}
}

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o644) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }
