package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
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

	"cairn/internal/testutil/testbin"
	"cairn/internal/testutil/testservers"
	"cairn/internal/testutil/wait"
)

// TestJobGraphKillNine runs the two-sub-topology top-words graph as the
// cairn binary, kills it with SIGKILL at random moments while it works
// through its input, restarts it each time on random slot counts (1-4, for
// each sub-topology), and at the end checks every closed window's top 5
// against the model: exact, each emitted once, Cairn-Out gap-free on the
// output and on the repartition stream. File store with incremental
// checkpoints on the embedded server, and S3 with full ones on an external
// nats-server.
func TestJobGraphKillNine(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CAIRN_GRAPH_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (rerun: CAIRN_GRAPH_SEED=%d go test ./e2e -run TestJobGraphKillNine)", seed, seed)
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	kills := 0
	for i, tc := range []struct{ store, mode, server string }{{"file", "incremental", "embedded"}, {"s3", "full", "external"}} {
		t.Run(tc.store+"-"+tc.mode+"-"+tc.server, func(t *testing.T) {
			url := startNATS(t)
			if tc.server == "external" {
				url = startExternalNATS(t)
			}
			kills += graphKillCase(t, bin, url, rand.New(rand.NewPCG(seed, uint64(i))), tc.store, tc.mode)
		})
	}
	t.Logf("%d SIGKILLs", kills)
}

func graphKillCase(t *testing.T, bin, url string, rng *rand.Rand, storeKind, mode string) int {
	_, js := connectJS(t, url)
	createStream(t, js, "LINES", "lines.>")
	data := t.TempDir()
	store := "file://" + t.TempDir() + "?create_dir=true"
	env := os.Environ()
	if storeKind == "s3" {
		store = testservers.StartGoFakeS3(t)
		env = append(env, "AWS_ACCESS_KEY_ID="+testservers.AccessKey, "AWS_SECRET_ACCESS_KEY="+testservers.SecretKey, "AWS_REGION="+testservers.Region, "AWS_EC2_METADATA_DISABLED=true")
	}
	jobYAML := strings.Replace(topWordsJob(t, url, data, store, 2), "mode: incremental", "mode: "+mode, 1)
	jobFile := filepath.Join(t.TempDir(), "topwords.yaml")
	if err := os.WriteFile(jobFile, []byte(jobYAML), 0o644); err != nil {
		t.Fatal(err)
	}

	in := &lineInput{t: t, js: js, rng: rng, step: 5}
	publish := in.publish

	var logs lockedBuffer
	var httpAddr string
	start := func() (*exec.Cmd, chan error) {
		// Each sub-topology on its own random slot count.
		slots := fmt.Sprintf("count=%d,top=%d", 1+rng.IntN(4), 1+rng.IntN(4))
		httpAddr = freeAddr(t)
		cmd := exec.Command(bin, "run", "--job", jobFile, "--stage-slots", slots, "--http", httpAddr, "--log-level", "info")
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = &logs, &logs
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return cmd, done
	}
	const killsPerCase = 5
	publish(1500)
	for k := range killsPerCase {
		cmd, done := start()
		time.Sleep(time.Duration(150+rng.IntN(900)) * time.Millisecond)
		if k == 2 {
			publish(1500) // more input arrives while it runs
		}
		select {
		case err := <-done:
			t.Fatalf("cairn exited before the kill: %v\n%s", err, tail(logs.String(), 4000))
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
	// The last run: a line far in the future closes every earlier window.
	in.closeWindows()
	model := topWordsModel(in.lines, in.times, in.times[len(in.times)-1])
	cmd, done := start()
	waitTopWindows(t, js, model, 2*time.Minute, func() {
		select {
		case err := <-done:
			t.Fatalf("cairn exited: %v\n%s", err, tail(logs.String(), 4000))
		default:
		}
	})
	// The repartition stream is purged below what no restore needs, once
	// both sub-topologies have committed enough checkpoints in this process.
	wait.Until(t, time.Minute, "a purge of the repartition stream", func() error {
		st, err := js.Stream(context.Background(), "CAIRN_RP_TOPWORDS_1")
		if err != nil {
			return err
		}
		info, err := st.Info(context.Background())
		if err != nil {
			return err
		}
		if info.State.FirstSeq <= 1 {
			return fmt.Errorf("first sequence %d", info.State.FirstSeq)
		}
		return nil
	})
	// /metrics has each sub-topology's figures.
	wait.Until(t, 30*time.Second, "per-sub-topology metrics", func() error {
		resp, err := http.Get("http://" + httpAddr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, want := range []string{`cairn_subtopology_records_out_total{sub_topology="topwords"}`, `cairn_subtopology_records_in_total{sub_topology="topwords.s1"}`, `cairn_subtopology_lag_messages{sub_topology="topwords.s1"}`} {
			if !strings.Contains(string(body), want) {
				return fmt.Errorf("no %s in /metrics", want)
			}
		}
		return nil
	})
	// A savepoint over HTTP covers every sub-topology.
	req, _ := http.NewRequest(http.MethodPost, "http://"+httpAddr+"/api/action/savepoint?name=g1", nil)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var sp struct {
		SubTopologies []struct {
			ID        uint64 `json:"id"`
			Savepoint string `json:"savepoint"`
		} `json:"sub_topologies"`
	}
	if err := json.Unmarshal(body, &sp); err != nil || resp.StatusCode != http.StatusOK || len(sp.SubTopologies) != 2 || sp.SubTopologies[1].Savepoint != "g1" {
		t.Fatalf("savepoint action: %d %s (%v)", resp.StatusCode, body, err)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Fatalf("graceful stop: %v\n%s", err, tail(logs.String(), 4000))
	}
	checkTopWords(t, js, model)
	st, err := js.Stream(context.Background(), "CAIRN_RP_TOPWORDS_1")
	if err != nil {
		t.Fatal(err)
	}
	info, _ := st.Info(context.Background())
	t.Logf("repartition stream after the purges: first sequence %d, %d messages left", info.State.FirstSeq, info.State.Msgs)
	return killsPerCase
}

// freeAddr is a 127.0.0.1 address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// lockedBuffer is a bytes.Buffer for a process's output and a reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
