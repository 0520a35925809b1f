package dashboard

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"cairn/internal/testutil/testpki"
)

// protected serves Handler behind Protect on 127.0.0.1, over TLS when a CA
// is given, and returns the base URL and the client to use.
func protected(t *testing.T, a Access, ca *testpki.CA, cert, key string) (string, *http.Client) {
	t.Helper()
	ln, err := Listen("127.0.0.1:0", a.Token)
	if err != nil {
		t.Fatal(err)
	}
	scheme, client := "http", &http.Client{Timeout: 10 * time.Second}
	if ca != nil {
		if ln, err = TLSListener(ln, cert, key); err != nil {
			t.Fatal(err)
		}
		scheme = "https"
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}
	}
	o := Options{Token: a.Token, Actions: map[string]func(*http.Request) (int, string){
		"savepoint": func(*http.Request) (int, string) { return http.StatusOK, "savepoint written" },
	}}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.Handle("/", Handler(newFakeSource(), o))
	srv := &http.Server{Handler: Protect(mux, a)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return scheme + "://" + ln.Addr().String(), client
}

type authCase struct {
	method, path string
	auth         func(*http.Request)
	want         int
}

func bearer(tok string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
}

func basic(pw string) func(*http.Request) {
	return func(r *http.Request) { r.SetBasicAuth("anyone", pw) }
}

func check(t *testing.T, base string, c *http.Client, cases []authCase) {
	t.Helper()
	for _, tc := range cases {
		req, err := http.NewRequest(tc.method, base+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.auth != nil {
			tc.auth(req)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s: %d %q, want %d", tc.method, tc.path, resp.StatusCode, body, tc.want)
		}
		if resp.StatusCode == http.StatusUnauthorized {
			if ch := resp.Header.Values("WWW-Authenticate"); len(ch) != 2 || !strings.HasPrefix(ch[0], "Bearer") || !strings.HasPrefix(ch[1], "Basic") {
				t.Errorf("%s %s: 401 with challenges %q, want Bearer and Basic", tc.method, tc.path, ch)
			}
			if strings.Contains(string(body), "s3cret-token-0123456789") {
				t.Errorf("%s %s: the 401 body carries the token", tc.method, tc.path)
			}
		}
	}
}

// TestProtectEveryEndpoint: with a token, every endpoint (the page,
// /metrics, the JSON, /healthz, the actions) needs it, as a Bearer token or
// a Basic password; a wrong or missing one is a 401 with both challenges.
func TestProtectEveryEndpoint(t *testing.T) {
	const tok = "s3cret-token-0123456789"
	base, c := protected(t, Access{Token: tok}, nil, "", "")
	var cases []authCase
	for _, p := range []string{"/", "/metrics", "/api/snapshot", "/healthz"} {
		cases = append(cases,
			authCase{"GET", p, nil, 401},
			authCase{"GET", p, bearer("wrong"), 401},
			authCase{"GET", p, bearer(tok + "x"), 401},
			authCase{"GET", p, basic("wrong"), 401},
			authCase{"GET", p, bearer(tok), 200},
			authCase{"GET", p, basic(tok), 200},
		)
	}
	cases = append(cases,
		authCase{"POST", "/api/action/savepoint?name=a", nil, 401},
		authCase{"POST", "/api/action/savepoint?name=a", bearer("wrong"), 401},
		authCase{"POST", "/api/action/savepoint?name=a", bearer(tok), 200},
		// A browser that logged in with Basic reaches the actions too.
		authCase{"POST", "/api/action/savepoint?name=a", basic(tok), 200},
	)
	check(t, base, c, cases)
}

// TestProtectPublicRead: --http-public-read opens GET and HEAD, never an
// action.
func TestProtectPublicRead(t *testing.T) {
	const tok = "s3cret-token-0123456789"
	base, c := protected(t, Access{Token: tok, PublicRead: true}, nil, "", "")
	check(t, base, c, []authCase{
		{"GET", "/", nil, 200},
		{"GET", "/metrics", nil, 200},
		{"GET", "/api/snapshot", nil, 200},
		{"HEAD", "/metrics", nil, 200},
		{"POST", "/api/action/savepoint?name=a", nil, 401},
		{"POST", "/api/action/savepoint?name=a", bearer("wrong"), 401},
		{"POST", "/api/action/savepoint?name=a", bearer(tok), 200},
	})
}

// TestTLSListener: HTTPS with a certificate from a CA the test made; a
// client that does not trust the CA is refused; a renewed certificate is
// picked up without a restart; a bad pair refuses at once.
func TestTLSListener(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir)
	cert, key := ca.Server("dashboard")
	const tok = "s3cret-token-0123456789"
	base, c := protected(t, Access{Token: tok}, ca, cert, key)
	if !strings.HasPrefix(base, "https://") {
		t.Fatal(base)
	}
	check(t, base, c, []authCase{{"GET", "/metrics", nil, 401}, {"GET", "/metrics", bearer(tok), 200}})
	if _, err := http.Get(base + "/healthz"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client without the CA: %v, want a certificate error", err)
	}
	plain := strings.Replace(base, "https://", "http://", 1)
	if resp, err := c.Get(plain + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP answered on the TLS port")
		}
	}

	// Renewal: a new pair from another CA replaces the files; the next
	// handshake serves it (the old client no longer trusts it).
	ca2 := testpki.NewCA(t, t.TempDir())
	cert2, key2 := ca2.Server("dashboard2")
	for _, f := range [][2]string{{cert2, cert}, {key2, key}} {
		b, err := os.ReadFile(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(2 * time.Second)
		if err := os.Chtimes(f[1], later, later); err != nil {
			t.Fatal(err)
		}
	}
	c2 := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca2.Pool()}}}
	check(t, base, c2, []authCase{{"GET", "/metrics", bearer(tok), 200}})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := TLSListener(ln, cert, ca.CertFile); err == nil || !strings.Contains(err.Error(), "--http-tls-cert") {
		t.Errorf("a certificate with the wrong key: %v, want a refusal naming --http-tls-cert", err)
	}
}
