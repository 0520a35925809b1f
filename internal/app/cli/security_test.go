package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn/checkpoint"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
)

// TestHTTPTokenSources: the token comes from a file (trimmed), the
// environment, or the command line with a warning; two command-line ways
// at once, an empty file and a short token are refused or warned about.
func TestHTTPTokenSources(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("from-the-file-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvHTTPToken, "from-the-environment-0123")
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for _, tc := range []struct {
		flag, file, want, warn string
	}{
		{"", file, "from-the-file-0123456789", ""},
		{"", "", "from-the-environment-0123", ""},
		{"on-the-command-line-0123", "", "on-the-command-line-0123", "--http-token puts the token on the command line"},
	} {
		logs.Reset()
		got, err := httpToken(tc.flag, tc.file, log)
		if err != nil || got != tc.want {
			t.Errorf("httpToken(%q, %q) = %q, %v; want %q", tc.flag, tc.file, got, err, tc.want)
		}
		if tc.warn != "" && !strings.Contains(logs.String(), tc.warn) {
			t.Errorf("httpToken(%q, %q): no warning %q in %q", tc.flag, tc.file, tc.warn, logs.String())
		}
		if strings.Contains(logs.String(), tc.want) {
			t.Errorf("the log carries the token: %s", logs.String())
		}
	}
	if _, err := httpToken("x", file, log); err == nil {
		t.Error("--http-token and --http-token-file together accepted")
	}
	if _, err := httpToken("", empty, log); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("an empty token file: %v", err)
	}
	f := &httpFlags{token: "short"}
	logs.Reset()
	if _, err := f.access(log); err != nil || !strings.Contains(logs.String(), "short") {
		t.Errorf("a short token: %v, log %q", err, logs.String())
	}
	t.Setenv(EnvHTTPToken, "")
	if _, err := (&httpFlags{publicRead: true}).access(log); err == nil {
		t.Error("--http-public-read without a token accepted")
	}
	if _, err := (&httpFlags{tlsCert: "c.pem"}).access(log); err == nil {
		t.Error("--http-tls-cert without --http-tls-key accepted")
	}
}

// savepointJob is the job the savepoint commands run on.
const savepointJob = `
name: refusals
input:  {stream: LINES, subjects: ["lines.>"]}
stages:
  - {name: count, module: "native:count", keyed: true}
output: {stream: COUNTS, subject: counts}
`

// TestSavepointLifecycleCLI: a reused savepoint name is answered 409 with
// what to do; savepoints.retain keeps the newest; `cairn savepoint ls|rm`
// list and remove them in the job's store.
func TestSavepointLifecycleCLI(t *testing.T) {
	dir := t.TempDir()
	jobFile := filepath.Join(dir, "job.yaml")
	src := savepointJob + "data_dir: " + filepath.Join(dir, "data") + "\ncheckpoint: {interval: 1h}\nsavepoints: {retain: 2}\n"
	if err := os.WriteFile(jobFile, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	j, err := job.Load(jobFile)
	if err != nil {
		t.Fatal(err)
	}
	r, err := runtime.Start(context.Background(), j, runtime.Options{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Engine.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		r.Close()
	}()
	const tok = "savepoint-token-0123456789"
	acc := dashboard.Access{Token: tok}
	ln, err := dashboard.Listen("127.0.0.1:0", tok)
	if err != nil {
		t.Fatal(err)
	}
	stop := runtime.ServeHTTP(ln, acc, r)
	defer stop()
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	take := func(name string) error {
		var out bytes.Buffer
		return cmdSavepoint(context.Background(), []string{"--http", ln.Addr().String(), "--name", name, "--http-token-file", tokFile}, &out, io.Discard)
	}
	for _, name := range []string{"one", "two"} {
		if err := take(name); err != nil {
			t.Fatal(err)
		}
	}
	err = take("two")
	if err == nil || !strings.Contains(err.Error(), "409") || !strings.Contains(err.Error(), "already exists") || !strings.Contains(err.Error(), "cairn savepoint rm two") {
		t.Fatalf("a reused name: %v, want 409 saying it exists and how to remove it", err)
	}
	// Straight at the endpoint too, without the client's help.
	req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/api/action/savepoint?name=one", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusConflict {
		t.Fatalf("POST a reused name: %v %v, want 409", resp, err)
	}
	if err := take("three"); err != nil {
		t.Fatal(err)
	}
	ls := func() string {
		var out bytes.Buffer
		if err := cmdSavepoint(context.Background(), []string{"ls", "--job-file", jobFile}, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	out := ls()
	if strings.Contains(out, "one ") || !strings.Contains(out, "two ") || !strings.Contains(out, "three ") {
		t.Fatalf("savepoints.retain 2 after one, two, three: ls says\n%s", out)
	}
	var rmOut bytes.Buffer
	if err := cmdSavepoint(context.Background(), []string{"rm", "two", "--job-file", jobFile}, &rmOut, io.Discard); err != nil || !strings.Contains(rmOut.String(), "removed savepoint two") {
		t.Fatalf("rm two: %v %s", err, rmOut.String())
	}
	if err := cmdSavepoint(context.Background(), []string{"rm", "two", "--job-file", jobFile}, io.Discard, io.Discard); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("rm a missing savepoint: %v", err)
	}
	if out := ls(); strings.Contains(out, "two ") || !strings.Contains(out, "three ") {
		t.Fatalf("after rm two: %s", out)
	}
	if err := take("two"); err != nil {
		t.Fatalf("a removed name taken again: %v", err)
	}
}

// TestRunRefusesHTTPFirst: a non-loopback --http without a token is refused
// before Start: the data directory is not even created.
func TestRunRefusesHTTPFirst(t *testing.T) {
	dir := t.TempDir()
	jobFile := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(jobFile, []byte(savepointJob), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	err := cmdRun(context.Background(), []string{"--job", jobFile, "--data", data, "--http", "0.0.0.0:0"}, io.Discard, io.Discard)
	var insecure *dashboard.InsecureAddrError
	if !errors.As(err, &insecure) {
		t.Fatalf("got %v, want an InsecureAddrError", err)
	}
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("data directory exists (%v): the job started before the HTTP address was checked", err)
	}
}
