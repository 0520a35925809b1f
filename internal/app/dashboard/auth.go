package dashboard

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// Access is who may use the HTTP port beyond what Listen already enforces
// (loopback only without a token).
type Access struct {
	// Token, when set, is required by every request: as
	// "Authorization: Bearer TOKEN" (Prometheus' bearer token file, curl), or
	// as the password of HTTP Basic authentication (a browser asks for it;
	// the user name is ignored).
	Token string
	// PublicRead lets GET and HEAD requests (the page, /metrics, the JSON
	// snapshot and stats, /healthz) through without the token. Actions are
	// POSTs and keep needing it.
	PublicRead bool
}

// Protect wraps h so that, with a token, every request must carry it,
// except the read-only ones when PublicRead is set. A request that carries
// the token as a Basic password reaches h with it as a Bearer token, which
// is what Handler's actions check. Without a token h is returned as is:
// the port is then loopback-only (Listen) and actions are checked by Handler.
func Protect(h http.Handler, a Access) http.Handler {
	if a.Token == "" {
		return h
	}
	want := sha256.Sum256([]byte(a.Token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.PublicRead && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			h.ServeHTTP(w, r)
			return
		}
		got, ok := presented(r)
		// Compared as hashes: equal lengths, so the time taken says nothing
		// about the token's length either.
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			w.Header().Add("WWW-Authenticate", `Bearer realm="cairn"`)
			w.Header().Add("WWW-Authenticate", `Basic realm="cairn", charset="UTF-8"`)
			w.Header().Set("Cache-Control", "no-store")
			http.Error(w, "cairn: this port needs the HTTP token (--http-token-file or CAIRN_HTTP_TOKEN of the job): "+
				"send \"Authorization: Bearer TOKEN\" (Prometheus: authorization.credentials_file), or give it as the password in a browser; "+
				"--http-public-read opens the read-only endpoints", http.StatusUnauthorized)
			return
		}
		if !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+a.Token)
		}
		h.ServeHTTP(w, r)
	})
}

// presented is the token a request carries: a Bearer token, or the
// password of Basic authentication.
func presented(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if tok, ok := strings.CutPrefix(h, "Bearer "); ok {
		return tok, true
	}
	if _, pw, ok := r.BasicAuth(); ok {
		return pw, true
	}
	return "", false
}

// TLSListener serves ln over TLS with the certificate and key in PEM files.
// Both are loaded now, so that a bad pair refuses the start; a handshake
// after either file changed (a renewal) loads them again, and keeps the old
// pair if the new one does not load.
func TLSListener(ln net.Listener, certFile, keyFile string) (net.Listener, error) {
	c := &certReloader{cert: certFile, key: keyFile}
	if err := c.load(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: c.get,
		NextProtos:     []string{"http/1.1"},
	}
	return tls.NewListener(ln, cfg), nil
}

// certReloader holds the serving certificate and reloads it when its files
// change.
type certReloader struct {
	cert, key string
	mu        struct {
		sync.Mutex
		pair    *tls.Certificate // the pair in use
		modTime time.Time        // the newer mtime of the two files when pair was loaded
	}
}

func (c *certReloader) modTime() time.Time {
	var t time.Time
	for _, p := range []string{c.cert, c.key} {
		if fi, err := os.Stat(p); err == nil && fi.ModTime().After(t) {
			t = fi.ModTime()
		}
	}
	return t
}

func (c *certReloader) load() error {
	mt := c.modTime()
	pair, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		return fmt.Errorf("dashboard: --http-tls-cert %s / --http-tls-key %s: %w", c.cert, c.key, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.pair, c.mu.modTime = &pair, mt
	return nil
}

func (c *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	stale := c.modTime().After(c.mu.modTime)
	pair := c.mu.pair
	c.mu.Unlock()
	if stale && c.load() == nil {
		c.mu.Lock()
		pair = c.mu.pair
		c.mu.Unlock()
	}
	return pair, nil
}
