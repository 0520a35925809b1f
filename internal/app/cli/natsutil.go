package cli

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"cairn/internal/app/job"
)

// EmbeddedNATS is an in-process nats-server with JetStream.
type EmbeddedNATS struct {
	srv *server.Server
}

// StartEmbeddedNATS starts nats-server on 127.0.0.1 (port 0: a random one)
// with JetStream storing under dir.
func StartEmbeddedNATS(dir string, port int) (*EmbeddedNATS, error) {
	return startEmbeddedNATS(dir, port, 0)
}

// startEmbeddedNATS is StartEmbeddedNATS with JetStream's memory bounded
// to jsMemory bytes (0: the server's default, 75% of the machine's).
func startEmbeddedNATS(dir string, port int, jsMemory int64) (*EmbeddedNATS, error) {
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
		JetStreamMaxMemory:     jsMemory,
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

// Port is the server's client port.
func (e *EmbeddedNATS) Port() int {
	if a, ok := e.srv.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Shutdown stops the server and waits for it.
func (e *EmbeddedNATS) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// connect dials NATS with the job's credentials (nats_auth; relative paths
// are relative to the job file). Secrets are never logged, and errors name
// files and fields, never a secret. Replies come to the inbox prefix
// InboxPrefix(job) so that a least-privilege user needs no subscribe
// permission on other clients' inboxes (docs/SECURITY.md).
func connect(url string, j *job.Job, log *slog.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("cairn-" + j.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.CustomInboxPrefix(InboxPrefix(j.Name)),
		// A permission the user lacks shows up only here (the request
		// itself times out): say which subject was refused.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("nats: asynchronous error", "err", err)
		}),
	}
	auth, err := authOptions(j.NATSAuth, j.Dir)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, append(opts, auth...)...)
	if err != nil {
		hint := ""
		var unknownCA x509.UnknownAuthorityError
		switch {
		case errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked):
			hint = fmt.Sprintf(": the server refused the credentials of the job's %v; check them against the server's users", j.NATSAuth)
		case errors.As(err, &unknownCA):
			hint = ": the server's certificate is not signed by a CA cairn trusts; set nats_auth.tls_ca to the CA's certificate"
		}
		return nil, fmt.Errorf("nats: connect %s: %w%s", redactURL(url), err, hint)
	}
	return nc, nil
}

// InboxPrefix is the reply subject prefix of job's NATS connection.
func InboxPrefix(job string) string { return "_INBOX_cairn." + job }

// authOptions maps nats_auth onto client options, reading the secret files.
func authOptions(a job.NATSAuth, dir string) ([]nats.Option, error) {
	path := func(p string) string {
		if p != "" && !filepath.IsAbs(p) && dir != "" {
			return filepath.Join(dir, p)
		}
		return p
	}
	var opts []nats.Option
	if a.CredsFile != "" {
		p := path(a.CredsFile)
		if _, err := os.Stat(p); err != nil {
			return nil, &job.Error{Field: "nats_auth.creds_file", Reason: err.Error()}
		}
		opts = append(opts, nats.UserCredentials(p))
	}
	if a.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(path(a.NKeyFile))
		if err != nil {
			return nil, &job.Error{Field: "nats_auth.nkey_file", Reason: fmt.Sprintf("%s: %v (want a file holding a user seed, SU...)", path(a.NKeyFile), err)}
		}
		opts = append(opts, o)
	}
	if a.User != "" {
		pw := a.Password
		if a.PasswordFile != "" {
			s, err := readSecretFile(path(a.PasswordFile))
			if err != nil {
				return nil, &job.Error{Field: "nats_auth.password_file", Reason: err.Error()}
			}
			pw = s
		}
		opts = append(opts, nats.UserInfo(a.User, pw))
	}
	if tok := a.Token; tok != "" || a.TokenFile != "" {
		if a.TokenFile != "" {
			s, err := readSecretFile(path(a.TokenFile))
			if err != nil {
				return nil, &job.Error{Field: "nats_auth.token_file", Reason: err.Error()}
			}
			tok = s
		}
		opts = append(opts, nats.Token(tok))
	}
	if a.TLSCA != "" {
		opts = append(opts, nats.RootCAs(path(a.TLSCA)))
	}
	if a.TLSCert != "" {
		opts = append(opts, nats.ClientCert(path(a.TLSCert), path(a.TLSKey)))
	}
	return opts, nil
}

// maxSecretBytes bounds a secret file: a token or password, not a disk image.
const maxSecretBytes = 64 << 10

// readSecretFile reads a secret (a token, a password) from a file, without
// its trailing white space (the newline an editor or echo adds). An empty
// file is refused: an empty secret is never what was meant. Errors name the
// file, never its content.
func readSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("secret file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretBytes+1))
	if err != nil {
		return "", fmt.Errorf("secret file %s: %w", path, err)
	}
	if len(b) > maxSecretBytes {
		return "", fmt.Errorf("secret file %s is larger than %d bytes: is it the right file?", path, maxSecretBytes)
	}
	s := strings.TrimRight(string(b), " \t\r\n")
	if s == "" {
		return "", fmt.Errorf("secret file %s is empty", path)
	}
	return s, nil
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
