// Package testservers starts S3-protocol servers for tests: gofakes3 in the
// test process and versitygw as a separate process, both on 127.0.0.1 with
// random ports, temporary storage and static credentials. Nothing is skipped:
// a server that cannot start fails the test.
package testservers

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// Static credentials every test server accepts; SetEnv exports them for the
// AWS SDK's default credential chain.
const (
	AccessKey = "cairntestkey"
	SecretKey = "cairntestsecret1234"
	Region    = "us-east-1"
	// Bucket is the bucket each server is started with (S3 names need at
	// least 3 characters).
	Bucket = "cairn"
	// VersityGWModule is the versitygw command built by StartVersityGW; its
	// version is the one go.mod's tool directive pins.
	VersityGWModule = "github.com/versity/versitygw/cmd/versitygw"
)

// SetEnv points the AWS SDK's default chain at the test credentials and
// turns off instance-metadata lookups and shared config files.
func SetEnv(t testing.TB) {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("AWS_ACCESS_KEY_ID", AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", SecretKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_REGION", Region)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "none"))
	t.Setenv("AWS_PROFILE", "")
}

// StoreURL is the s3:// URL of bucket on the server at endpoint (host:port).
func StoreURL(addr, bucket string) string {
	return fmt.Sprintf("s3://%s?endpoint=http://%s&use_path_style=true&region=%s", bucket, addr, Region)
}

// StartGoFakeS3 starts gofakes3 (in-memory backend) over real HTTP on
// 127.0.0.1, creates Bucket, calls SetEnv, and returns the store URL. The
// server stops when the test ends.
func StartGoFakeS3(t testing.TB) string {
	t.Helper()
	SetEnv(t)
	backend := s3mem.New()
	if err := backend.CreateBucket(Bucket); err != nil {
		t.Fatalf("gofakes3: create bucket: %v", err)
	}
	faker := gofakes3.New(backend)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("gofakes3: listen: %v", err)
	}
	srv := &http.Server{Handler: faker.Server(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return StoreURL(ln.Addr().String(), Bucket)
}

var build struct {
	once sync.Once
	path string
	err  error
}

// VersityGWBinary builds versitygw from the Go module cache (go build of the
// tool pinned in go.mod) once per cache directory and returns its path. The
// binary is cached under os.UserCacheDir()/cairn-testservers, falling back to
// a temp directory.
func VersityGWBinary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		build.path, build.err = buildVersityGW()
	})
	if build.err != nil {
		t.Fatalf("versitygw: %v", build.err)
	}
	return build.path
}

func buildVersityGW() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/versity/versitygw").Output()
	if err != nil {
		return "", fmt.Errorf("find versitygw version in go.mod: %w", err)
	}
	version := strings.TrimSpace(string(out))
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "cairn-testservers")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		dir = os.TempDir()
	}
	bin := filepath.Join(dir, "versitygw-"+version)
	if st, err := os.Stat(bin); err == nil && st.Mode().IsRegular() {
		return bin, nil
	}
	tmp := fmt.Sprintf("%s.tmp-%d", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, VersityGWModule)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", VersityGWModule, err, msg)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// StartVersityGW runs versitygw (posix backend on a temp directory) as a
// separate process on 127.0.0.1, creates Bucket, calls SetEnv, and returns
// the store URL. The process is killed when the test ends.
func StartVersityGW(t testing.TB) string {
	t.Helper()
	bin := VersityGWBinary(t)
	SetEnv(t)
	root := t.TempDir()
	var addr string
	var cmd *exec.Cmd
	var exited chan struct{}
	for attempt := 0; ; attempt++ {
		addr = freeAddr(t)
		cmd = exec.Command(bin, "--port", addr, "--access", AccessKey, "--secret", SecretKey, "posix", root)
		logf, err := os.Create(filepath.Join(root, "..", fmt.Sprintf("versitygw-%d.log", attempt)))
		if err == nil {
			cmd.Stdout, cmd.Stderr = logf, logf
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("versitygw: start: %v", err)
		}
		exited = make(chan struct{})
		go func(cmd *exec.Cmd, exited chan struct{}) {
			cmd.Wait()
			close(exited)
		}(cmd, exited)
		if waitTCP(addr, 15*time.Second, exited) {
			break
		}
		cmd.Process.Kill()
		<-exited
		if attempt == 2 {
			t.Fatalf("versitygw: not listening on %s (log in %s)", addr, filepath.Dir(root))
		}
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := s3.New(s3.Options{
		Region:       Region,
		BaseEndpoint: aws.String("http://" + addr),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	})
	if _, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(Bucket)}); err != nil {
		t.Fatalf("versitygw: create bucket: %v", err)
	}
	return StoreURL(addr, Bucket)
}

func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitTCP polls until addr accepts connections, the process exits (exited
// is closed), or the timeout passes.
func waitTCP(addr string, timeout time.Duration, exited <-chan struct{}) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return true
		}
		select {
		case <-exited:
			return false
		case <-time.After(25 * time.Millisecond):
		}
	}
	return false
}
