package runtime

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
)

func TestStoreFull(t *testing.T) {
	for _, c := range []struct {
		err    string
		full   bool
		stream string
	}{
		{"engine: fast-batch publish to stream COUNTS: error processing batch at sequence 71: nats: API error: code=503 err_code=10077 description=maximum messages exceeded", true, "COUNTS"},
		{"engine: publish to counts.3: nats: API error: code=503 err_code=10077 description=maximum bytes exceeded", true, "subject:counts.3"},
		{"engine: publish to counts.3: nats: API error: code=400 err_code=10002 description=resource limits exceeded for account", true, "subject:counts.3"},
		{"runtime: something: insufficient resources", true, ""},
		{"engine: fast-batch publish: commit: nats: API error: code=400 err_code=10208 description=batch publish ID unknown", false, ""},
	} {
		full, stream := storeFull(fmt.Errorf("sub: %w", errors.New(c.err)))
		if full != c.full || stream != c.stream {
			t.Errorf("storeFull(%q) = %v, %q; want %v, %q", c.err, full, stream, c.full, c.stream)
		}
	}
}

// TestKeepListener: one address serves two servers in turn; the first's
// shutdown does not close it.
func TestKeepListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := NewKeepListener(ln)
	defer k.Close()
	for i, want := range []string{"one", "two"} {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, want) })}
		go func() { _ = srv.Serve(k.Next()) }()
		resp, err := http.Get("http://" + ln.Addr().String())
		if err != nil {
			t.Fatalf("server %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != want {
			t.Errorf("server %d answered %q, want %q", i, b, want)
		}
		http.DefaultClient.CloseIdleConnections()
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
