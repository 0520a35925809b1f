// Package natscluster runs a three-node NATS cluster for tests: nats-server
// processes built from the module cairn depends on (testbin), JetStream on
// every node, client, route and monitoring ports on 127.0.0.1. A test can
// kill, restart, pause (SIGSTOP) and resume a node and ask which node leads
// a stream, so R3 streams and KV buckets can be exercised through failures.
package natscluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cairn/internal/base/natsembed"
	"cairn/internal/testutil/testbin"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Size is the number of nodes in a cluster.
const Size = 3

// ErrNoLeader is a stream without a current leader among the nodes.
var ErrNoLeader = errors.New("natscluster: stream has no leader")

// Cluster is a running three-node cluster. Its methods are safe for
// concurrent use.
type Cluster struct {
	tb    testing.TB
	bin   string
	name  string
	opts  Options
	mu    sync.Mutex
	nodes [Size]*node
}

// Options change how the nodes run.
type Options struct {
	// NoAdvertise keeps the nodes from telling clients the other nodes'
	// addresses: a client reaches only the URLs it was given (a test's
	// proxies in front of every node, say).
	NoAdvertise bool
}

type node struct {
	name    string
	dir     string
	client  int
	route   int
	monitor int
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has exited
	paused  bool
}

// Start builds nats-server, starts three nodes and waits until every node
// reports healthy with JetStream (a meta leader elected). The cluster stops
// when the test ends.
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	return StartWith(tb, Options{})
}

// StartWith is Start with opts.
func StartWith(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	bin, err := testbin.Build("github.com/nats-io/nats-server/v2", "nats-server")
	if err != nil {
		tb.Fatal(err)
	}
	c := &Cluster{tb: tb, bin: bin, name: "cairn-test", opts: opts}
	root := tb.TempDir()
	ports := freePorts(tb, 3*Size)
	for i := range c.nodes {
		c.nodes[i] = &node{
			name:    fmt.Sprintf("n%d", i+1),
			dir:     filepath.Join(root, fmt.Sprintf("n%d", i+1)),
			client:  ports[3*i],
			route:   ports[3*i+1],
			monitor: ports[3*i+2],
		}
		if err := os.MkdirAll(c.nodes[i].dir, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	for i := range c.nodes {
		if err := c.writeConfig(i); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(c.stopAll)
	for i := range c.nodes {
		if err := c.start(i); err != nil {
			tb.Fatal(err)
		}
	}
	for i := range c.nodes {
		c.WaitHealthy(i, 60*time.Second)
	}
	c.waitPlacement(60 * time.Second)
	return c
}

// waitPlacement waits until an R3 stream can be placed: every node
// healthy is not enough, the meta leader may still count a peer offline
// until it has heard from it ("no suitable peers for placement, peer
// offline"), and a test's first stream would fail on that.
func (c *Cluster) waitPlacement(timeout time.Duration) {
	c.tb.Helper()
	nc := c.Connect()
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		c.tb.Fatal(err)
	}
	c.createStream(js, jetstream.StreamConfig{Name: "NATSCLUSTER_PLACEMENT", Subjects: []string{"natscluster.placement"}, Storage: jetstream.MemoryStorage}, timeout)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, "NATSCLUSTER_PLACEMENT"); err != nil {
		c.tb.Fatalf("natscluster: delete the placement check's stream: %v", err)
	}
}

// CreateStream creates stream cfg with a replica on every node. It tries
// again for up to 30 s: even once an R3 stream could be placed, a create
// can time out for a moment on a cluster that just started.
func (c *Cluster) CreateStream(js jetstream.JetStream, cfg jetstream.StreamConfig) {
	c.tb.Helper()
	c.createStream(js, cfg, 30*time.Second)
}

func (c *Cluster) createStream(js jetstream.JetStream, cfg jetstream.StreamConfig, timeout time.Duration) {
	c.tb.Helper()
	cfg.Replicas = Size
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := js.CreateStream(ctx, cfg)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("natscluster: create R%d stream %s: still failing after %v: %v", Size, cfg.Name, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *Cluster) writeConfig(i int) error {
	n := c.nodes[i]
	advertise := ""
	if c.opts.NoAdvertise {
		advertise = "\n  no_advertise: true"
	}
	var routes []string
	for _, o := range c.nodes {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.route))
	}
	conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream {
  store_dir: %q
}
cluster {
  name: %s
  listen: 127.0.0.1:%d
  routes: [%s]%s
}
`, n.name, n.client, n.monitor, filepath.Join(n.dir, "js"), c.name, n.route, strings.Join(routes, ", "), advertise)
	return os.WriteFile(filepath.Join(n.dir, "nats.conf"), []byte(conf), 0o644)
}

func (c *Cluster) start(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if n.cmd != nil {
		return fmt.Errorf("natscluster: start %s: already running", n.name)
	}
	log, err := os.OpenFile(filepath.Join(n.dir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.bin, "-c", filepath.Join(n.dir, "nats.conf"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("natscluster: start %s: %w", n.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(done)
	}()
	n.cmd, n.done, n.paused = cmd, done, false
	return nil
}

// URL is node i's client URL.
func (c *Cluster) URL(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].client)
}

// Addr is node i's client address (host:port).
func (c *Cluster) Addr(i int) string {
	return fmt.Sprintf("127.0.0.1:%d", c.nodes[i].client)
}

// URLs is every node's client URL, comma-separated (for nats.Connect).
func (c *Cluster) URLs() string {
	var s []string
	for i := range c.nodes {
		s = append(s, c.URL(i))
	}
	return strings.Join(s, ",")
}

// Name is node i's server name (what stream cluster info reports).
func (c *Cluster) Name(i int) string { return c.nodes[i].name }

// Index is the node whose server name is name, or -1.
func (c *Cluster) Index(name string) int {
	for i, n := range c.nodes {
		if n.name == name {
			return i
		}
	}
	return -1
}

// Connect connects a client to every node (it reconnects to the others
// when one goes away); it is closed when the test ends. Pings every 250 ms
// find a paused node within a second, so the client moves on to another.
func (c *Cluster) Connect(opts ...nats.Option) *nats.Conn {
	c.tb.Helper()
	return c.connect(c.URLs(), opts)
}

// ConnectTo connects a client to node i first (it reconnects to the others
// when node i goes away).
func (c *Cluster) ConnectTo(i int, opts ...nats.Option) *nats.Conn {
	c.tb.Helper()
	urls := []string{c.URL(i)}
	for j := range c.nodes {
		if j != i {
			urls = append(urls, c.URL(j))
		}
	}
	return c.connect(strings.Join(urls, ","), append([]nats.Option{nats.DontRandomize()}, opts...))
}

func (c *Cluster) connect(urls string, opts []nats.Option) *nats.Conn {
	c.tb.Helper()
	opts = append([]nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond),
		nats.Timeout(2 * time.Second),
		nats.PingInterval(250 * time.Millisecond),
		nats.MaxPingsOutstanding(3),
	}, opts...)
	nc, err := nats.Connect(urls, opts...)
	if err != nil {
		c.tb.Fatalf("natscluster: connect: %v", err)
	}
	c.tb.Cleanup(nc.Close)
	return nc
}

// Kill sends SIGKILL to node i and waits for it to exit.
func (c *Cluster) Kill(i int) { c.signalStop(i, syscall.SIGKILL) }

// Stop shuts node i down gracefully (SIGTERM) and waits for it to exit.
func (c *Cluster) Stop(i int) { c.signalStop(i, syscall.SIGTERM) }

func (c *Cluster) signalStop(i int, sig syscall.Signal) {
	c.tb.Helper()
	c.mu.Lock()
	n := c.nodes[i]
	cmd, done := n.cmd, n.done
	if cmd == nil {
		c.mu.Unlock()
		c.tb.Fatalf("natscluster: stop %s: not running", n.name)
		return
	}
	if n.paused {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	_ = cmd.Process.Signal(sig)
	n.cmd, n.done, n.paused = nil, nil, false
	c.mu.Unlock()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Restart starts a stopped or killed node i again on the same ports and
// store, and waits until it is healthy.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	if err := c.start(i); err != nil {
		c.tb.Fatal(err)
	}
	c.WaitHealthy(i, 60*time.Second)
}

// Pause stops node i with SIGSTOP: its connections stay open but it
// answers nothing, as a node cut off or stalled would.
func (c *Cluster) Pause(i int) { c.signalPaused(i, syscall.SIGSTOP, true) }

// Resume continues a paused node i with SIGCONT.
func (c *Cluster) Resume(i int) { c.signalPaused(i, syscall.SIGCONT, false) }

func (c *Cluster) signalPaused(i int, sig syscall.Signal, paused bool) {
	c.tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if n.cmd == nil {
		c.tb.Fatalf("natscluster: signal %s: not running", n.name)
	}
	if err := n.cmd.Process.Signal(sig); err != nil {
		c.tb.Fatalf("natscluster: signal %s: %v", n.name, err)
	}
	n.paused = paused
}

// Healthy reports nil when node i's /healthz answers ok (JetStream enabled
// and current with the meta leader), else what it answered.
func (c *Cluster) Healthy(i int) error {
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", c.nodes[i].monitor))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("natscluster: %s: healthz %s", c.nodes[i].name, resp.Status)
	}
	return nil
}

// WaitHealthy waits until node i is healthy; the test fails with the
// node's log tail when it is not within timeout.
func (c *Cluster) WaitHealthy(i int, timeout time.Duration) {
	c.tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := c.Healthy(i)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("natscluster: %s not healthy after %v: %v\n%s", c.nodes[i].name, timeout, err, c.LogTail(i, 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// LogTail is the last n bytes of node i's log.
func (c *Cluster) LogTail(i, n int) string {
	b, _ := os.ReadFile(filepath.Join(c.nodes[i].dir, "log"))
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// StreamLeader is the index of the node leading stream (a KV bucket's
// stream is "KV_<bucket>"), asked through js.
func (c *Cluster) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (int, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return -1, fmt.Errorf("natscluster: stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return -1, fmt.Errorf("natscluster: stream %s info: %w", stream, err)
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return -1, fmt.Errorf("%w: %s", ErrNoLeader, stream)
	}
	i := c.Index(info.Cluster.Leader)
	if i < 0 {
		return -1, fmt.Errorf("%w: %s led by unknown server %q", ErrNoLeader, stream, info.Cluster.Leader)
	}
	return i, nil
}

// WaitStreamLeader waits until stream has a leader other than not (-1: any)
// and returns it.
func (c *Cluster) WaitStreamLeader(js jetstream.JetStream, stream string, not int, timeout time.Duration) int {
	c.tb.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		i, err := c.StreamLeader(ctx, js, stream)
		cancel()
		if err == nil && i != not {
			return i
		}
		if err == nil {
			err = fmt.Errorf("still led by %s", c.nodes[i].name)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	c.tb.Fatalf("natscluster: no new leader of %s within %v: %v", stream, timeout, last)
	return -1
}

// CPUTime is the user and system CPU time the running nodes have used so
// far (ProcessCPU). Benchmarks compare it before and after a run: a loaded
// machine inflates it far less than elapsed time.
func (c *Cluster) CPUTime() (time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var total time.Duration
	for _, n := range c.nodes {
		if n.cmd == nil {
			continue
		}
		d, err := ProcessCPU(n.cmd.Process.Pid)
		if err != nil {
			return 0, fmt.Errorf("natscluster: cpu of %s: %w", n.name, err)
		}
		total += d
	}
	return total, nil
}

// ProcessCPU is the user and system CPU time process pid has used so far,
// from /proc/<pid>/stat (Linux; in USER_HZ ticks, 100 per second on every
// Linux architecture Go supports).
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from its ")".
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("short stat %q", b)
	}
	var total time.Duration
	for _, s := range f[11:13] { // utime, stime (fields 14 and 15)
		ticks, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, err
		}
		total += time.Duration(ticks) * (time.Second / 100)
	}
	return total, nil
}

func (c *Cluster) stopAll() {
	for i := range c.nodes {
		c.mu.Lock()
		running := c.nodes[i].cmd != nil
		c.mu.Unlock()
		if running {
			c.signalStop(i, syscall.SIGKILL)
		}
	}
}

// freePorts reserves n distinct free ports on 127.0.0.1.
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports, err := natsembed.FreePorts(n)
	if err != nil {
		tb.Fatal(err)
	}
	return ports
}
