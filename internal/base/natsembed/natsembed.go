// Package natsembed starts a nats-server with JetStream inside the process:
// the job runtime's `nats: embedded`, the demo's and the drill's servers, and
// the engine's tests all start it here, with one way to report a failed
// start.
package natsembed

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options choose the server's name, port, store and JetStream memory.
type Options struct {
	// Name is the server's name (default "cairn-embedded").
	Name string
	// Dir holds JetStream's store, under Dir/nats.
	Dir string
	// Port is the client port on 127.0.0.1; 0 picks a free one.
	Port int
	// JSMemory bounds JetStream's memory in bytes (0: the server's default,
	// 75% of the machine's).
	JSMemory int64
	// Hint ends the error of a failed start, telling the user what to fix
	// (e.g. which flag chooses the directory).
	Hint string
	// ClusterName, RoutePort and Routes make the server a node of a
	// cluster (StartCluster sets them): it listens for routes on
	// 127.0.0.1:RoutePort and connects to Routes.
	ClusterName string
	RoutePort   int
	Routes      []string
}

// Server is an in-process nats-server with JetStream.
type Server struct {
	srv *server.Server
}

// Start starts the server on 127.0.0.1 and waits until it takes clients.
func Start(o Options) (*Server, error) {
	port := o.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	name := o.Name
	if name == "" {
		name = "cairn-embedded"
	}
	opts := &server.Options{
		ServerName:             name,
		Host:                   "127.0.0.1",
		Port:                   port,
		JetStream:              true,
		StoreDir:               filepath.Join(o.Dir, "nats"),
		NoLog:                  true,
		NoSigs:                 true,
		DisableJetStreamBanner: true,
		MaxPayload:             8 << 20,
		JetStreamMaxMemory:     o.JSMemory,
	}
	if o.ClusterName != "" {
		opts.Cluster = server.ClusterOpts{Name: o.ClusterName, Host: "127.0.0.1", Port: o.RoutePort}
		opts.Routes = server.RoutesFromStr(strings.Join(o.Routes, ","))
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	// The server reports a failed start (JetStream's store directory cannot
	// be created, the port is taken) only to its logger, then never becomes
	// ready: catch that report and return it at once instead of waiting.
	fatal := &fatalLog{}
	srv.SetLogger(fatal, false, false)
	srv.Start()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if msg := fatal.get(); msg != "" {
			srv.Shutdown()
			err := fmt.Errorf("embedded nats (store %s): %s", opts.StoreDir, msg)
			if o.Hint != "" {
				err = fmt.Errorf("%w: %s", err, o.Hint)
			}
			return nil, err
		}
		if srv.ReadyForConnections(50 * time.Millisecond) {
			break
		}
		if time.Now().After(deadline) {
			srv.Shutdown()
			return nil, fmt.Errorf("embedded nats (store %s): not ready after 10s", opts.StoreDir)
		}
	}
	return &Server{srv: srv}, nil
}

// fatalLog is the embedded server's logger: it keeps the first fatal report
// and drops everything else (the server runs quiet, as with NoLog).
type fatalLog struct {
	mu    sync.Mutex
	fatal string // the first Fatalf, formatted
}

func (l *fatalLog) Fatalf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal == "" {
		l.fatal = fmt.Sprintf(format, v...)
	}
}

func (l *fatalLog) get() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal
}

func (*fatalLog) Noticef(string, ...any) {}
func (*fatalLog) Warnf(string, ...any)   {}
func (*fatalLog) Errorf(string, ...any)  {}
func (*fatalLog) Debugf(string, ...any)  {}
func (*fatalLog) Tracef(string, ...any)  {}

var _ server.Logger = (*fatalLog)(nil)

// URL is the client URL of the server.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Port is the server's client port.
func (s *Server) Port() int {
	if a, ok := s.srv.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Shutdown stops the server and waits for it.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}
