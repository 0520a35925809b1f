package cli

import (
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"cairn/internal/job"
)

// EmbeddedNATS is an in-process nats-server with JetStream.
type EmbeddedNATS struct {
	srv *server.Server
}

// StartEmbeddedNATS starts nats-server on 127.0.0.1 (port 0: a random one)
// with JetStream storing under dir.
func StartEmbeddedNATS(dir string, port int) (*EmbeddedNATS, error) {
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName:             "cairn-embedded",
		Host:                   "127.0.0.1",
		Port:                   port,
		JetStream:              true,
		StoreDir:               filepath.Join(dir, "nats"),
		NoLog:                  true,
		NoSigs:                 true,
		DisableJetStreamBanner: true,
		MaxPayload:             8 << 20,
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
			return nil, fmt.Errorf("embedded nats (store %s): %s: the embedded server keeps its streams under the data directory; fix that directory or choose another with --data or data_dir", opts.StoreDir, msg)
		}
		if srv.ReadyForConnections(50 * time.Millisecond) {
			break
		}
		if time.Now().After(deadline) {
			srv.Shutdown()
			return nil, fmt.Errorf("embedded nats (store %s): not ready after 10s", opts.StoreDir)
		}
	}
	return &EmbeddedNATS{srv: srv}, nil
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
func (e *EmbeddedNATS) URL() string { return e.srv.ClientURL() }

// Shutdown stops the server and waits for it.
func (e *EmbeddedNATS) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// connect dials NATS with the job's credentials. Secrets are never logged.
func connect(url string, a job.NATSAuth, name string) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
	}
	if a.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	}
	if a.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(a.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats: nkey_file: %w", err)
		}
		opts = append(opts, o)
	}
	if a.User != "" {
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	}
	if a.Token != "" {
		opts = append(opts, nats.Token(a.Token))
	}
	if a.TLSCA != "" {
		opts = append(opts, nats.RootCAs(a.TLSCA))
	}
	if a.TLSCert != "" {
		opts = append(opts, nats.ClientCert(a.TLSCert, a.TLSKey))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats: connect %s: %w", redactURL(url), err)
	}
	return nc, nil
}

// redactURL hides a password in a URL's user info.
func redactURL(u string) string {
	if i := indexAt(u); i >= 0 {
		if j := indexScheme(u); j >= 0 && j < i {
			return u[:j] + "***" + u[i:]
		}
	}
	return u
}

func indexAt(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '@' {
			return i
		}
	}
	return -1
}

func indexScheme(s string) int {
	for i := 0; i+2 < len(s); i++ {
		if s[i:i+3] == "://" {
			return i + 3
		}
	}
	return -1
}
