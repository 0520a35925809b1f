package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn/internal/testutil/testservers"
)

// s3Servers are the S3-protocol servers the S3 tests run against.
var s3Servers = map[string]func(testing.TB) string{
	"gofakes3":  testservers.StartGoFakeS3,
	"versitygw": testservers.StartVersityGW,
}

// onlyReader hides every method of r but Read: a stream that cannot be
// rewound or read at an offset.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// TestS3Multipart: objects over one part go up as multipart uploads, from a
// file (parts read in place, in parallel) and from a stream (parts read into
// buffers); both read back byte for byte, ranged reads included, and a
// conditional multipart upload refuses an existing object (versitygw).
func TestS3Multipart(t *testing.T) {
	for name, start := range s3Servers {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s, err := OpenStore(ctx, start(t))
			if err != nil {
				t.Fatal(err)
			}
			bs := s.(*RetryStore).s.(*blobStore)
			bs.partSize = 5 << 20 // S3's smallest part
			data := make([]byte, 2*bs.partSize+12345)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			f, err := os.Create(filepath.Join(t.TempDir(), "obj"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Write(data); err != nil {
				t.Fatal(err)
			}
			// The file stands at offset 100: Put sends from there on.
			if _, err := f.Seek(100, io.SeekStart); err != nil {
				t.Fatal(err)
			}
			check := func(obj string, want []byte) {
				t.Helper()
				got, err := readAll(ctx, s, obj)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%s: got %d bytes, want %d (equal: false)", obj, len(got), len(want))
				}
				st, err := s.Stat(ctx, obj)
				if err != nil || st.Size != int64(len(want)) {
					t.Fatalf("%s: stat %+v %v, want size %d", obj, st, err, len(want))
				}
				if int64(len(want)) < bs.partSize+10 {
					return
				}
				rc, err := s.GetRange(ctx, obj, bs.partSize-10, 20)
				if err != nil {
					t.Fatal(err)
				}
				part, _ := io.ReadAll(rc)
				rc.Close()
				if !bytes.Equal(part, want[bs.partSize-10:bs.partSize+10]) {
					t.Fatalf("%s: a range across parts differs", obj)
				}
			}
			if err := s.Put(ctx, "mp/file", f); err != nil {
				t.Fatal(err)
			}
			check("mp/file", data[100:])
			if err := s.Put(ctx, "mp/stream", onlyReader{bytes.NewReader(data)}); err != nil {
				t.Fatal(err)
			}
			check("mp/stream", data)
			// Exactly one part's worth from a stream.
			if err := s.Put(ctx, "mp/onepart", onlyReader{bytes.NewReader(data[:bs.partSize])}); err != nil {
				t.Fatal(err)
			}
			check("mp/onepart", data[:bs.partSize])

			// gofakes3 ignores If-None-Match on the completion (Create's HEAD
			// still guards it; manifests are far below one part anyway).
			if name != "gofakes3" {
				err = bs.write(ctx, "mp/file", bytes.NewReader(data), true)
				if err := bs.wrap("create", "mp/file", err); !errors.Is(err, ErrExists) {
					t.Fatalf("conditional multipart upload over an existing object: %v, want ErrExists", err)
				}
				check("mp/file", data[100:])
			}
			if err := bs.write(ctx, "mp/created", bytes.NewReader(data), true); err != nil {
				t.Fatal(err)
			}
			check("mp/created", data)
		})
	}
}

// TestS3CancelledPutLeavesNothing: a Put whose context ends mid-upload
// (a multipart one, between parts) fails and leaves no object.
func TestS3CancelledPutLeavesNothing(t *testing.T) {
	ctx := context.Background()
	s, err := OpenStore(ctx, testservers.StartGoFakeS3(t))
	if err != nil {
		t.Fatal(err)
	}
	bs := s.(*RetryStore).s.(*blobStore)
	bs.partSize = 5 << 20
	cctx, cancel := context.WithCancel(ctx)
	r := io.MultiReader(bytes.NewReader(make([]byte, bs.partSize+1)), readerFunc(func([]byte) (int, error) {
		cancel()
		return 0, cctx.Err()
	}))
	if err := s.Put(cctx, "cancel/obj", r); err == nil {
		t.Fatal("a cancelled Put succeeded")
	}
	if _, err := s.Stat(ctx, "cancel/obj"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after a cancelled Put: %v, want ErrNotFound", err)
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestS3URL: every parameter gocloud's s3blob took is still taken; a wrong
// one is refused naming the parameter and what it wants.
func TestS3URL(t *testing.T) {
	testservers.SetEnv(t)
	ok := []string{
		"s3://b",
		"s3://b/some/prefix/?region=eu-west-1",
		"s3://b?endpoint=http://127.0.0.1:9000&use_path_style=true&region=us-east-1",
		"s3://b?endpoint=http://127.0.0.1:9000&s3ForcePathStyle=true&hostname_immutable=true&disable_https=false",
		"s3://b?profile=p&anonymous=true&dualstack=true&fips=false&accelerate=false&awssdk=v2",
		"s3://b?role=arn:aws:iam::123456789012:role/cairn&ssetype=aws:kms&kmskeyid=k&rate_limiter_capacity=100",
		"s3://b?request_checksum_calculation=when_required&response_checksum_validation=when_supported",
	}
	for _, raw := range ok {
		u, _ := url.Parse(raw)
		if _, err := parseS3URL(u); err != nil {
			t.Errorf("%s: %v", raw, err)
		}
	}
	for raw, want := range map[string][]string{
		"s3:///prefix":                        {"no bucket"},
		"s3://b?endpiont=http://x":            {`unknown parameter "endpiont"`, "endpoint", "use_path_style"},
		"s3://b?use_path_style=yes":           {"use_path_style", `"yes"`, "true or false"},
		"s3://b?endpoint=127.0.0.1:9000":      {"endpoint", "http://127.0.0.1:9000"},
		"s3://b?role=cairn":                   {"role", "ARN"},
		"s3://b?ssetype=rot13":                {"ssetype", "AES256"},
		"s3://b?rate_limiter_capacity=lots":   {"rate_limiter_capacity"},
		"s3://b?request_checksum_calculation": {"request_checksum_calculation", "when_required"},
	} {
		_, err := OpenStore(context.Background(), raw)
		if err == nil {
			t.Errorf("%s: opened", raw)
			continue
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v: does not say %q", raw, err, w)
			}
		}
	}
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	if _, err := OpenStore(context.Background(), "s3://b"); err == nil || !strings.Contains(err.Error(), "region=") {
		t.Errorf("no region anywhere: %v, want an error naming region=", err)
	}
}

// TestS3MissingBucket: a bucket that does not exist is said so, and is not
// mistaken for an empty store (ErrNotFound).
func TestS3MissingBucket(t *testing.T) {
	raw := testservers.StartGoFakeS3(t)
	raw = strings.Replace(raw, "s3://"+testservers.Bucket, "s3://nosuchbucket", 1)
	s, err := OpenStore(context.Background(), raw)
	if err != nil {
		t.Fatal(err)
	}
	err = s.List(context.Background(), "x/", func(ObjectInfo) error { return nil })
	if err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `bucket "nosuchbucket" does not exist`) {
		t.Fatalf("list in a missing bucket: %v", err)
	}
}
