package dashboard

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestListenRefusesPublicAddrWithoutToken(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "example.com:0"} {
		ln, err := Listen(addr, "")
		if err == nil {
			ln.Close()
			t.Errorf("Listen(%q, no token) succeeded, want a refusal", addr)
			continue
		}
		var insecure *InsecureAddrError
		if !errors.As(err, &insecure) {
			t.Errorf("Listen(%q, no token): %v (%T), want an *InsecureAddrError", addr, err, err)
		}
		if !strings.Contains(err.Error(), "--http-token") {
			t.Errorf("Listen(%q, no token): %q does not say to pass --http-token", addr, err)
		}
	}
	for _, c := range []struct{ addr, token string }{
		{"127.0.0.1:0", ""}, {"localhost:0", ""}, {"0.0.0.0:0", "s3cret"},
	} {
		ln, err := Listen(c.addr, c.token)
		if err != nil {
			t.Errorf("Listen(%q, token %q): %v", c.addr, c.token, err)
			continue
		}
		ln.Close()
	}
	if _, err := Listen("127.0.0.1", ""); err == nil {
		t.Error("Listen without a port succeeded")
	}
}

func TestActionsNeedTheToken(t *testing.T) {
	var calls atomic.Int32
	o := Options{Token: "s3cret", Actions: map[string]func(*http.Request) (int, string){
		"savepoint": func(*http.Request) (int, string) { calls.Add(1); return http.StatusOK, "savepoint 31 written" },
	}}
	url := serve(t, newFakeSource(), o)

	post := func(path string, header ...string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	if code, body := post("/api/action/savepoint"); code != http.StatusUnauthorized || !strings.Contains(body, "--http-token") {
		t.Errorf("POST without token: %d %q, want 401 saying --http-token", code, body)
	}
	if code, _ := post("/api/action/savepoint", "Authorization", "Bearer wrong"); code != http.StatusUnauthorized {
		t.Errorf("POST with a wrong token: %d, want 401", code)
	}
	if calls.Load() != 0 {
		t.Fatalf("the action ran %d times without the token", calls.Load())
	}
	if code, body := post("/api/action/savepoint", "Authorization", "Bearer s3cret"); code != http.StatusOK || !strings.Contains(body, "savepoint 31") {
		t.Errorf("POST with the token: %d %q, want 200 and the action's text", code, body)
	}
	if calls.Load() != 1 {
		t.Errorf("the action ran %d times, want 1", calls.Load())
	}
	if code, _ := post("/api/action/stop", "Authorization", "Bearer s3cret"); code != http.StatusNotFound {
		t.Errorf("POST of an unknown action: %d, want 404", code)
	}
	resp, err := http.Get(url + "/api/action/savepoint")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET of an action: %d, want 405", resp.StatusCode)
	}
	if calls.Load() != 1 {
		t.Errorf("the action ran %d times, want 1", calls.Load())
	}
}

// TestActionsWithoutToken: on loopback without a token, actions run for same-origin
// requests and are refused to other sites (CSRF) and to rebound host names.
func TestActionsWithoutToken(t *testing.T) {
	var calls atomic.Int32
	h := Handler(newFakeSource(), Options{Actions: map[string]func(*http.Request) (int, string){
		"checkpoint": func(*http.Request) (int, string) { calls.Add(1); return 0, "checkpoint 32 triggered" },
	}})
	for _, c := range []struct {
		host, origin string
		want         int
	}{
		{"127.0.0.1:8080", "", http.StatusOK},
		{"localhost:8080", "http://localhost:8080", http.StatusOK},
		{"[::1]:8080", "", http.StatusOK},
		{"127.0.0.1:8080", "https://evil.example", http.StatusForbidden},
		{"evil.example:8080", "http://evil.example:8080", http.StatusForbidden},
	} {
		req := httptest.NewRequest(http.MethodPost, "/api/action/checkpoint", nil)
		req.Host = c.host
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("host %s origin %q: %d %q, want %d", c.host, c.origin, rec.Code, rec.Body, c.want)
		}
	}
	if calls.Load() != 3 {
		t.Errorf("the action ran %d times, want 3", calls.Load())
	}
}

func TestSnapshotJSON(t *testing.T) {
	src := newFakeSource()
	src.snap.Drill = []byte(`{"not json`)
	url := serve(t, src, Options{Token: "s3cret", Actions: map[string]func(*http.Request) (int, string){"savepoint": nil, "checkpoint": nil}})
	resp, err := http.Get(url + "/api/snapshot")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/snapshot: %s %s", resp.Status, body)
	}
	var v apiSnapshot
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("GET /api/snapshot: %v", err)
	}
	if v.Lag != v.StreamLastSeq-v.ProcessedSeq || v.Lag == 0 {
		t.Errorf("lag = %d, want stream last %d - processed %d", v.Lag, v.StreamLastSeq, v.ProcessedSeq)
	}
	if len(v.Checkpoints) != 30 || len(v.Restores) != 3 || v.Standby == nil || v.WatermarkMs == nil {
		t.Errorf("snapshot has %d checkpoints, %d restores, standby %v, watermark %v", len(v.Checkpoints), len(v.Restores), v.Standby, v.WatermarkMs)
	}
	if c := v.Checkpoints[0]; c.Async <= 0 || c.PredictedRestore <= c.Async || c.FullState != c.BytesUploaded {
		t.Errorf("checkpoint 1 (full) = %+v", c)
	}
	if v.Drill != nil {
		t.Errorf("an invalid drill document was passed on: %s", v.Drill)
	}
	if !v.TokenRequired || strings.Join(v.Actions, ",") != "checkpoint,savepoint" {
		t.Errorf("token_required %v, actions %v", v.TokenRequired, v.Actions)
	}
	if strings.Contains(string(body), "hunter2") || !strings.Contains(v.Checkpoints[13].Error, "s3://REDACTED@bucket") {
		t.Errorf("checkpoint error not redacted: %q", v.Checkpoints[13].Error)
	}
}

func TestPageHeaders(t *testing.T) {
	rec := httptest.NewRecorder()
	Handler(newFakeSource(), Options{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `id="c-checkpoint-bytes"`) {
		t.Fatalf("GET /: %d", rec.Code)
	}
	csp := rec.Header().Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'sha256-") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}
	// No external asset at run time.
	body := strings.ReplaceAll(rec.Body.String(), "'http://www.w3.org/2000/svg'", "") // a namespace name, not fetched
	if strings.Contains(body, "http://") || strings.Contains(body, "https://") || strings.Contains(body, "//cdn") {
		t.Error("the page refers to an external URL")
	}
	rec = httptest.NewRecorder()
	Handler(newFakeSource(), Options{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/nope", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("GET /nope: %d, want 404", rec.Code)
	}
}
