package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn/internal/app/job"
	"cairn/operators/builtin"
	"cairn/wasm"
)

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
	if got, _ := ReadSecretFile(filepath.Join(dir, "pw")); got != "hunter2-secret" {
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
	rt, err := wasm.NewRuntime(ctx, wasm.RuntimeConfig{MaxModuleBytes: MaxModuleBytes})
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
