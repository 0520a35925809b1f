package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/testutil/testbin"
	"cairn/internal/testutil/testservers"
)

// cairnBinary runs the cairn binary (`cairn run`) and restarts it at
// will: the harness of the SIGKILL tests. args is called at each start
// (it may draw random slot counts); an --http address is added, kept in
// httpAddr.
type cairnBinary struct {
	t        testing.TB
	bin      string
	env      []string
	args     func() []string
	logs     syncBuffer
	cmd      *exec.Cmd
	done     chan error
	httpAddr string
	kills    int
}

// start starts the binary.
func (c *cairnBinary) start() {
	c.t.Helper()
	c.httpAddr = freeAddr(c.t)
	c.cmd = exec.Command(c.bin, append(append([]string{"run"}, c.args()...), "--http", c.httpAddr, "--log-level", "info")...)
	c.cmd.Env = c.env
	c.cmd.Stdout, c.cmd.Stderr = &c.logs, &c.logs
	dieWithTest(c.cmd)
	if err := c.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.done = make(chan error, 1)
	go func() { c.done <- c.cmd.Wait() }()
}

// alive fails the test if the binary exited.
func (c *cairnBinary) alive() {
	c.t.Helper()
	select {
	case err := <-c.done:
		c.t.Fatalf("cairn exited: %v\n%s", err, tail(c.logs.String(), 4000))
	default:
	}
}

// kill SIGKILLs the running binary and waits for it to die.
func (c *cairnBinary) kill() {
	c.t.Helper()
	c.alive()
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
	c.kills++
}

// stop stops the binary gracefully (SIGTERM), which must succeed.
func (c *cairnBinary) stop() {
	c.t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-c.done; err != nil {
		c.t.Fatalf("graceful stop: %v\n%s", err, tail(c.logs.String(), 4000))
	}
}

// killStore is the checkpoint store of a SIGKILL case and the binary's
// environment: a file store in a temporary directory ("file"), or an
// in-process S3 server ("s3") with its credentials.
func killStore(t testing.TB, kind string) (store string, env []string) {
	env = os.Environ()
	if kind != "s3" {
		return "file://" + t.TempDir() + "?create_dir=true", env
	}
	return testservers.StartGoFakeS3(t), append(env, "AWS_ACCESS_KEY_ID="+testservers.AccessKey, "AWS_SECRET_ACCESS_KEY="+testservers.SecretKey,
		"AWS_REGION="+testservers.Region, "AWS_EC2_METADATA_DISABLED=true")
}

// killConfig is one configuration of a SIGKILL test, set up: its NATS
// server, checkpoint store and mode, and a random source of its own.
type killConfig struct {
	url, store, mode string
	rng              *rand.Rand
}

// forKillCases runs a SIGKILL test in its two configurations — a file
// store with incremental checkpoints on the embedded server, S3 with full
// ones on an external nats-server — each with a cairnBinary ready to
// start (run sets its args), and logs the seed (CAIRN_GRAPH_SEED reruns
// one) and the kills. stream makes the test's random sequence its own.
func forKillCases(t *testing.T, stream uint64, run func(t *testing.T, c *cairnBinary, k killConfig)) {
	seed := graphSeed(t)
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	kills := 0
	for i, tc := range []struct{ store, mode, server string }{{"file", "incremental", "embedded"}, {"s3", "full", "external"}} {
		t.Run(tc.store+"-"+tc.mode+"-"+tc.server, func(t *testing.T) {
			k := killConfig{url: startNATS(t), mode: tc.mode, rng: rand.New(rand.NewPCG(seed, stream+uint64(i)))}
			if tc.server == "external" {
				k.url = startExternalNATS(t)
			}
			c := &cairnBinary{t: t, bin: bin}
			k.store, c.env = killStore(t, tc.store)
			run(t, c, k)
			kills += c.kills
		})
	}
	t.Logf("%d SIGKILLs", kills)
}

// graphSeed is a randomized test's seed: CAIRN_GRAPH_SEED, else the clock;
// logged with the command that reruns it.
func graphSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CAIRN_GRAPH_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (rerun: CAIRN_GRAPH_SEED=%d go test ./e2e -run '^%s$')", seed, seed, strings.SplitN(t.Name(), "/", 2)[0])
	return seed
}

// writeJob writes a job file into a temporary directory, with its
// checkpoint mode set to mode, and returns its path.
func writeJob(t *testing.T, name, yaml, mode string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(strings.Replace(yaml, "mode: incremental", "mode: "+mode, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// randomSlots is --slots N and --stage-slots for the keyed stages named,
// each drawn in 1-4.
func randomSlots(rng *rand.Rand, stages ...string) []string {
	var ss []string
	for _, s := range stages {
		ss = append(ss, fmt.Sprintf("%s=%d", s, 1+rng.IntN(4)))
	}
	return []string{"--slots", strconv.Itoa(1 + rng.IntN(4)), "--stage-slots", strings.Join(ss, ",")}
}

// checkCounts compares what was emitted with what must have been, key by
// key (a multiset: each once, nothing else).
func checkCounts(t *testing.T, got, want map[string]int) {
	t.Helper()
	for k, c := range want {
		if got[k] != c {
			t.Errorf("%s: emitted %d times, want %d", k, got[k], c)
		}
	}
	for k, c := range got {
		if want[k] == 0 {
			t.Errorf("%s: emitted %d times, never expected", k, c)
		}
	}
}

// keyedValues counts outputs by "<Cairn-Key>=<value>".
func keyedValues(msgs []jetstream.Msg) map[string]int {
	got := map[string]int{}
	for _, m := range msgs {
		got[m.Headers().Get(engine.HeaderKey)+"="+string(m.Data())]++
	}
	return got
}

// testJobYAML completes a test graph's job the way every graph test runs it
// (16 key groups, batches of 64, incremental checkpoints every 200 ms into
// store) and returns its YAML.
func testJobYAML(t testing.TB, j *job.Job, data, store string, slots int) string {
	t.Helper()
	j.KeyGroups, j.Slots, j.DataDir, j.BatchSize = 16, slots, data, 64
	j.Checkpoint = &job.Checkpoint{Store: store, Interval: 200 * time.Millisecond, Mode: "incremental"}
	b, err := j.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
