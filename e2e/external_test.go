package e2e

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/internal/testutil/testbin"
)

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startExternalNATS runs nats-server (built from the module cairn depends on)
// as a separate process with JetStream on 127.0.0.1.
func startExternalNATS(t testing.TB) string {
	t.Helper()
	bin, err := testbin.Build("github.com/nats-io/nats-server/v2", "nats-server")
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", t.TempDir())
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		nc, err := nats.Connect(url)
		if err == nil {
			nc.Close()
			return url
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server did not start: %v\n%s", err, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestExternalServerBinary runs the built cairn binary as a child process
// against a separate nats-server process: wordcount exact, then a graceful
// stop with SIGTERM.
func TestExternalServerBinary(t *testing.T) {
	binaryWordcount(t, startExternalNATS(t), false)
}

// TestStopOnStdinEOF: `cairn run --stop-on-stdin-eof` stops gracefully
// (exit 0, outputs exact) when its standard input closes — how cairn demo
// stops its job process where there is no SIGTERM (Windows).
func TestStopOnStdinEOF(t *testing.T) {
	binaryWordcount(t, startNATS(t), true)
}

// binaryWordcount runs the wordcount job as the cairn binary against the
// NATS server at url until every output is stored, stops it with SIGTERM,
// or by closing its standard input when stdinEOF, and checks the outputs.
func binaryWordcount(t *testing.T, url string, stdinEOF bool) {
	cairn, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	_, js := connectJS(t, url)
	createStream(t, js, "LINES", "lines.>")
	msgs, model := lineCorpus(11, 500, 2000)
	publishAll(t, js, msgs)
	total := 0
	for _, n := range model {
		total += n
	}

	dir := t.TempDir()
	jobFile := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(jobFile, fmt.Appendf(nil, wordcountJob, "embedded", "exactly_once", 2, filepath.Join(dir, "data")), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cairn, "run", "--job", jobFile, "--nats", url, "--http", "off", "--log-level", "info")
	var log syncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	stop := func() { _ = cmd.Process.Signal(syscall.SIGTERM) }
	if stdinEOF {
		cmd.Args = append(cmd.Args, "--stop-on-stdin-eof")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stop = func() { stdin.Close() }
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Wait until the output stream holds one output per word.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		s, err := js.Stream(t.Context(), "COUNTS")
		if err == nil {
			if info, err := s.Info(t.Context()); err == nil && int(info.State.Msgs) >= total {
				break
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("cairn exited early: %v\n%s", err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("timed out waiting for %d outputs\n%s", total, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("cairn exited with %v after the stop\n%s", err, log.String())
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("cairn did not stop\n%s", log.String())
	}
	if !strings.Contains(log.String(), "job stopped") {
		t.Errorf("no \"job stopped\" in the log: not a graceful stop\n%s", log.String())
	}
	checkOutputs(t, js, "COUNTS", "counts", 128, model)
}
