// Package natsproc runs nats-server (built from the module cairn depends on)
// as a separate process that a test can stop, kill and start again on the
// same port and the same store directory: a server restart as an operator
// does one, or a crash.
package natsproc

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/internal/testutil/testbin"
)

// Server is one nats-server with JetStream on 127.0.0.1.
type Server struct {
	t    testing.TB
	bin  string
	port int
	dir  string // JetStream store directory, kept across restarts
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  bytes.Buffer
}

// Start builds nats-server (once per test process), starts it on a free
// port with its store in a temporary directory, waits until it accepts
// clients, and stops it when the test ends. extra are more server flags.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin, err := testbin.Build("github.com/nats-io/nats-server/v2", "nats-server")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, bin: bin, port: FreePort(t), dir: t.TempDir(), args: extra}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// FreePort returns a TCP port free on 127.0.0.1 just now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// URL is the server's client URL (the same across restarts).
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

// Port is the server's client port.
func (s *Server) Port() int { return s.port }

// Running reports whether the process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Restart starts the server again (or the first time) on the same port and
// store, and waits until it serves JetStream. The port may still be held a
// moment by the process that just exited: starting is retried.
func (s *Server) Restart() {
	s.t.Helper()
	if s.Running() {
		s.t.Fatal("natsproc: Restart while the server runs")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.startOnce()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("natsproc: nats-server did not start: %v\n%s", err, s.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *Server) startOnce() error {
	args := append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js", "-sd", s.dir}, s.args...)
	cmd := exec.Command(s.bin, args...)
	done := make(chan struct{})
	s.mu.Lock()
	s.log.Reset()
	cmd.Stdout, cmd.Stderr = &lockedWriter{s}, &lockedWriter{s}
	s.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-done:
			return errors.New("nats-server exited at start")
		default:
		}
		if nc, err := nats.Connect(s.URL(), nats.Timeout(time.Second)); err == nil {
			// JetStream is ready once its account info answers (it
			// recovers the streams from the store first).
			_, err = nc.Request("$JS.API.INFO", nil, 2*time.Second)
			nc.Close()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return errors.New("nats-server did not serve JetStream within 15s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the server gracefully (SIGTERM: it flushes its store) and
// waits for it to exit. A server already down is left so.
func (s *Server) Stop() { s.signal(syscall.SIGTERM) }

// Kill kills the server (SIGKILL: a crash) and waits for it to exit.
func (s *Server) Kill() { s.signal(syscall.SIGKILL) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Log is the current process's output.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

type lockedWriter struct{ s *Server }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.s.log.Write(p)
}
