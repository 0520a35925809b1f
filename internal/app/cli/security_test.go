package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	"cairn/operators/builtin"
	"cairn/wasm"
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

// TestNATSSecretFiles: password_file and token_file are read relative to
// the job file, trimmed; a missing or empty one is an error naming the
// field and the file, never a secret.
func TestNATSSecretFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte("hunter2-secret\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := authOptions(job.NATSAuth{User: "u", PasswordFile: "pw"}, dir); err != nil {
		t.Fatal(err)
	}
	if got, _ := readSecretFile(filepath.Join(dir, "pw")); got != "hunter2-secret" {
		t.Fatalf("read %q", got)
	}
	for _, a := range []job.NATSAuth{
		{User: "u", PasswordFile: "missing"},
		{TokenFile: "missing"},
		{NKeyFile: "pw"}, // not a seed: the content must not be quoted
		{CredsFile: "missing.creds"},
	} {
		_, err := authOptions(a, dir)
		var je *job.Error
		if !errors.As(err, &je) || !strings.HasPrefix(je.Field, "nats_auth.") {
			t.Errorf("%v: %v, want a nats_auth field error", a, err)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%v: the error carries the secret: %v", a, err)
		}
	}
}

// TestModulePin: a stage's sha256 must match the module's bytes (a file
// or a builtin); a mismatch refuses with both hashes.
func TestModulePin(t *testing.T) {
	ctx := context.Background()
	rt, err := wasm.NewRuntime(ctx, wasm.RuntimeConfig{MaxModuleBytes: maxModuleBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	code, _ := builtin.Lookup("count")
	sum := sha256.Sum256(code)
	want := hex.EncodeToString(sum[:])
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "count.wasm"), code, 0o644); err != nil {
		t.Fatal(err)
	}
	wrong := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		module, pin string
		ok          bool
	}{
		{"count.wasm", want, true},
		{"builtin:count", want, true},
		{"count.wasm", wrong, false},
		{"builtin:count", wrong, false},
	} {
		j, err := job.Parse([]byte(strings.Replace(testJob, `module: "native:count"`, `module: "`+tc.module+`", sha256: "`+tc.pin+`"`, 1)))
		if err != nil {
			t.Fatal(err)
		}
		j.Dir = dir
		_, hashes, err := buildStages(ctx, rt, j, memoryBudget{}, quietLog())
		if tc.ok {
			if err != nil || hashes["count"] != want {
				t.Errorf("%s pinned to its hash: %v (hash %s)", tc.module, err, hashes["count"])
			}
			continue
		}
		var je *job.Error
		if !errors.As(err, &je) || je.Field != "stages[0].sha256" || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), wrong) {
			t.Errorf("%s pinned to another hash: %v, want a refusal on stages[0].sha256 naming both hashes", tc.module, err)
		}
	}
}

// TestAWSCredentialSource: the chain link is named from the URL, the
// environment and the shared files alone; nothing configured names the
// instance metadata service and AWS_EC2_METADATA_DISABLED. Nothing here
// (or anywhere in the tests) asks that service.
func TestAWSCredentialSource(t *testing.T) {
	home := t.TempDir()
	withCreds := t.TempDir()
	if err := os.MkdirAll(filepath.Join(withCreds, ".aws"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(withCreds, ".aws", "credentials"), []byte("[default]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const u = "s3://bucket/p?region=us-east-1"
	for _, tc := range []struct {
		url  string
		env  map[string]string
		want string
		none bool
	}{
		{u, map[string]string{"HOME": home, "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "hunter2-secret"}, "environment", false},
		{u, map[string]string{"HOME": home, "AWS_PROFILE": "edge"}, "profile edge", false},
		{u + "&profile=site", map[string]string{"HOME": home}, "profile site", false},
		{u, map[string]string{"HOME": withCreds}, filepath.Join(withCreds, ".aws", "credentials"), false},
		{u, map[string]string{"HOME": home, "AWS_WEB_IDENTITY_TOKEN_FILE": "/t"}, "web identity", false},
		{u, map[string]string{"HOME": home, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2"}, "container", false},
		{u + "&anonymous=true", map[string]string{"HOME": home}, "anonymous", false},
		{u, map[string]string{"HOME": home}, "EC2 instance metadata", true},
		{u, map[string]string{"HOME": home, "AWS_EC2_METADATA_DISABLED": "true"}, "disabled", true},
	} {
		getenv := func(k string) string { return tc.env[k] }
		src, none := awsCredentialSource(tc.url, getenv)
		if !strings.Contains(src, tc.want) || none != tc.none {
			t.Errorf("%s %v: %q none=%v, want %q none=%v", tc.url, tc.env, src, none, tc.want, tc.none)
		}
		var logs bytes.Buffer
		logAWSCredentials(slog.New(slog.NewTextHandler(&logs, nil)), tc.url, getenv)
		if strings.Contains(logs.String(), "hunter2") || strings.Contains(logs.String(), "AKIAEXAMPLE") {
			t.Errorf("the log carries a credential: %s", logs.String())
		}
		if tc.none && !strings.Contains(logs.String(), "AWS_EC2_METADATA_DISABLED") {
			t.Errorf("no credentials: the warning does not name AWS_EC2_METADATA_DISABLED: %s", logs.String())
		}
	}
}

// TestSavepointLifecycleCLI: a reused savepoint name is answered 409 with
// what to do; savepoints.retain keeps the newest; `cairn savepoint ls|rm`
// list and remove them in the job's store.
func TestSavepointLifecycleCLI(t *testing.T) {
	dir := t.TempDir()
	jobFile := filepath.Join(dir, "job.yaml")
	src := testJob + "data_dir: " + filepath.Join(dir, "data") + "\ncheckpoint: {interval: 1h}\nsavepoints: {retain: 2}\n"
	if err := os.WriteFile(jobFile, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	j, err := job.Load(jobFile)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Start(context.Background(), j, RunOptions{}, quietLog())
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
	stop := serveHTTP(ln, acc, r)
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
