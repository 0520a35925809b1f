package runtime

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/internal/app/job"
)

// Connect connects to the job's NATS server (not the embedded one) as its
// engines do: the job's credentials, inbox prefix and reconnect policy.
func Connect(j *job.Job, log *slog.Logger) (*nats.Conn, error) {
	return connect(j.NATS, j, log)
}

// connect dials NATS with the job's credentials (nats_auth; relative paths
// are relative to the job file). Secrets are never logged, and errors name
// files and fields, never a secret. Replies come to the inbox prefix
// InboxPrefix(job) so that a least-privilege user needs no subscribe
// permission on other clients' inboxes (docs/SECURITY.md).
func connect(url string, j *job.Job, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("cairn-" + j.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		// A link that stops carrying bytes without closing (a partition)
		// is noticed after 3 unanswered pings: within about a minute,
		// not the client's default of minutes; then it reconnects.
		nats.PingInterval(20 * time.Second),
		nats.MaxPingsOutstanding(3),
		nats.CustomInboxPrefix(InboxPrefix(j.Name)),
		// A permission the user lacks shows up only here (the request
		// itself times out): say which subject was refused.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("nats: asynchronous error", "err", err)
		}),
	}
	opts = append(opts, extra...)
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
		return nil, fmt.Errorf("nats: connect %s: %w%s", RedactURL(url), err, hint)
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
			s, err := ReadSecretFile(path(a.PasswordFile))
			if err != nil {
				return nil, &job.Error{Field: "nats_auth.password_file", Reason: err.Error()}
			}
			pw = s
		}
		opts = append(opts, nats.UserInfo(a.User, pw))
	}
	if tok := a.Token; tok != "" || a.TokenFile != "" {
		if a.TokenFile != "" {
			s, err := ReadSecretFile(path(a.TokenFile))
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

// ReadSecretFile reads a secret (a token, a password) from a file, without
// its trailing white space (the newline an editor or echo adds). An empty
// file is refused: an empty secret is never what was meant. Errors name the
// file, never its content.
func ReadSecretFile(path string) (string, error) {
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

// RedactURL hides a password in a URL's user info.
func RedactURL(u string) string {
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
