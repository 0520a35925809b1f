package natsembed

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrCluster is a cluster that did not form: a node failed to start, or
// JetStream elected no meta leader, or it knew too few peers, in time.
var ErrCluster = errors.New("natsembed: cluster")

// ClusterOptions choose an in-process cluster's nodes.
type ClusterOptions struct {
	// Name is the cluster's name and its nodes' prefix (default
	// "cairn-embedded"): node i is "<Name>-n<i+1>".
	Name string
	// Dir holds node i's JetStream store under Dir/n<i+1>/nats; the nodes
	// find their streams there again when started on it next time.
	Dir string
	// Nodes is the number of nodes (default 3, the smallest cluster that
	// keeps R3 streams writable through the loss of one).
	Nodes int
	// JSMemory bounds each node's JetStream memory (0: the default).
	JSMemory int64
	// Hint ends the error of a failed start (see Options.Hint).
	Hint string
	// Ready bounds the wait for the nodes to agree on a JetStream meta
	// leader, and for it to know every node as a place for streams
	// (default 30s).
	Ready time.Duration
}

// Cluster is a cluster of in-process servers, routed to each other on
// 127.0.0.1, with JetStream clustered over them: streams and KV buckets
// may have up to Nodes replicas.
type Cluster struct {
	nodes []*Server
}

// StartCluster starts the nodes and waits until every one reports
// JetStream healthy (a meta leader elected, the node current with it) and
// the meta leader may place a stream on every node. The client and route
// ports are free ones picked now.
func StartCluster(o ClusterOptions) (*Cluster, error) {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.Nodes < 1 {
		return nil, fmt.Errorf("%w: %d nodes", ErrCluster, o.Nodes)
	}
	if o.Name == "" {
		o.Name = "cairn-embedded"
	}
	if o.Ready == 0 {
		o.Ready = 30 * time.Second
	}
	ports, err := FreePorts(o.Nodes)
	if err != nil {
		return nil, fmt.Errorf("%w: route ports: %w", ErrCluster, err)
	}
	routes := make([]string, o.Nodes)
	for i, p := range ports {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	c := &Cluster{}
	for i := range o.Nodes {
		s, err := Start(Options{
			Name: fmt.Sprintf("%s-n%d", o.Name, i+1), Dir: filepath.Join(o.Dir, fmt.Sprintf("n%d", i+1)),
			JSMemory: o.JSMemory, Hint: o.Hint, ClusterName: o.Name, RoutePort: ports[i], Routes: routes,
		})
		if err != nil {
			c.Shutdown()
			return nil, fmt.Errorf("%w: node %d: %w", ErrCluster, i+1, err)
		}
		c.nodes = append(c.nodes, s)
	}
	deadline := time.Now().Add(o.Ready)
	for i, s := range c.nodes {
		for {
			h := s.srv.Healthz(&server.HealthzOptions{})
			if h.StatusCode == 200 && s.srv.JetStreamIsCurrent() {
				break
			}
			if time.Now().After(deadline) {
				c.Shutdown()
				return nil, fmt.Errorf("%w: node %d not healthy after %v: %s %s", ErrCluster, i+1, o.Ready, h.Status, h.Error)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Healthy is not yet placeable: the meta leader places a replicated
	// stream only on peers whose statistics it has received (the first
	// come a moment after a node starts); before that, a create is
	// refused with "no suitable peers for placement".
	for !c.placeable() {
		if time.Now().After(deadline) {
			c.Shutdown()
			return nil, fmt.Errorf("%w: the meta leader knows fewer than %d peers to place streams on after %v", ErrCluster, o.Nodes, o.Ready)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return c, nil
}

// placeable reports whether the meta leader counts every node as a peer
// it may place a stream on.
func (c *Cluster) placeable() bool {
	for _, s := range c.nodes {
		if len(s.srv.JetStreamClusterPeers()) == len(c.nodes) {
			return true
		}
	}
	return false
}

// Nodes is the cluster's nodes, in order.
func (c *Cluster) Nodes() []*Server { return c.nodes }

// URLs is every node's client URL, comma-separated (for nats.Connect and
// a job's nats:).
func (c *Cluster) URLs() string {
	var s []string
	for _, n := range c.nodes {
		s = append(s, n.URL())
	}
	return strings.Join(s, ",")
}

// Shutdown stops every node.
func (c *Cluster) Shutdown() {
	for _, n := range c.nodes {
		n.Shutdown()
	}
}

// FreePorts picks n distinct free ports on 127.0.0.1 (every listener is
// held until all are picked, so none repeats).
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}
