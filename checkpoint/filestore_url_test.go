package checkpoint

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileStoreURLRoundTrips: a store opened from FileStoreURL(dir) keeps
// its objects in dir itself, whatever the directory's name holds. Pasted
// after "file://", a '#' or '?' cut the path short (the store landed in a
// parent's sibling) and a '%' did not parse.
func TestFileStoreURLRoundTrips(t *testing.T) {
	for _, name := range []string{"plain", "with space", "job#2", "what?now", "100%", "sp%20ace", "ünï;côde", "a+b=c&d"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), name, "store")
			u, err := FileStoreURL(dir, true)
			if err != nil {
				t.Fatal(err)
			}
			s, err := OpenStore(context.Background(), u)
			if err != nil {
				t.Fatalf("OpenStore(%q): %v", u, err)
			}
			defer s.Close(context.Background())
			if err := s.Put(context.Background(), "jobs/j/x", bytes.NewReader([]byte("here"))); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(dir, "jobs", "j", "x"))
			if err != nil || string(got) != "here" {
				t.Fatalf("URL %q: the object is not in %s: %v", u, dir, err)
			}
		})
	}
}

// TestFileStoreURLRelative: a relative directory becomes an absolute URL
// (file://rel/dir would name a host).
func TestFileStoreURLRelative(t *testing.T) {
	wd := t.TempDir()
	t.Chdir(wd)
	u, err := FileStoreURL(filepath.Join("rel", "store"), false)
	if err != nil {
		t.Fatal(err)
	}
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p, err := FileStorePath(pu)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(wd, "rel", "store"); p != want {
		t.Fatalf("%q names %s, want %s", u, p, want)
	}
}

// TestFileURLPaths: the URL forms of Windows paths (a drive letter, a
// share) and of Unix ones, each way, on either system's rules.
func TestFileURLPaths(t *testing.T) {
	for _, c := range []struct{ path, url string }{
		{"/var/lib/cairn/store", "file:///var/lib/cairn/store"},
		{"C:/Users/me/cairn data/store", "file:///C:/Users/me/cairn%20data/store"},
		{"//server/share/cairn#1", "file:////server/share/cairn%231"},
	} {
		if got := fileURL(c.path, false); got != c.url {
			t.Errorf("fileURL(%q) = %q, want %q", c.path, got, c.url)
		}
		if got := fileURL(c.path, true); got != c.url+"?create_dir=true" {
			t.Errorf("fileURL(%q, create) = %q", c.path, got)
		}
	}
	for _, c := range []struct {
		url     string
		windows bool
		want    string // "" = refused
	}{
		{"file:///var/lib/cairn/store", false, "/var/lib/cairn/store"},
		{"file://localhost/var/lib/cairn", false, "/var/lib/cairn"},
		{"file:///C:/Users/me/cairn%20data/store", true, "C:/Users/me/cairn data/store"},
		{"file:///c:/x", true, "c:/x"},
		{"file:///C:/x", false, "/C:/x"}, // on Unix, a directory named "C:"
		{"file:////server/share/cairn%231", true, "//server/share/cairn#1"},
		{"file://server/share/x", true, "//server/share/x"},
		{"file://server/share/x", false, ""},
		{"file://", false, ""},
		{"file:///1:/x", true, "/1:/x"},
	} {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatal(err)
		}
		got, err := fileURLPath(u, c.windows)
		switch {
		case c.want == "" && err == nil:
			t.Errorf("%q (windows %v): %q, want refused", c.url, c.windows, got)
		case c.want == "" && !strings.Contains(err.Error(), "file store URL"):
			t.Errorf("%q: the error does not say what it refused: %v", c.url, err)
		case c.want != "" && (err != nil || got != c.want):
			t.Errorf("%q (windows %v): %q, %v; want %q", c.url, c.windows, got, err, c.want)
		}
	}
}

// TestStorePathNotURL: a path where a store URL belongs is refused with
// the URL to use instead.
func TestStorePathNotURL(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "chk")
	_, err := OpenStore(context.Background(), dir)
	want, _ := FileStoreURL(dir, false)
	if err == nil || !strings.Contains(err.Error(), "not a path") || !strings.Contains(err.Error(), want) {
		t.Fatalf("OpenStore(%q): %v; want the advice to use %s", dir, err, want)
	}
	if _, err := OpenStore(context.Background(), "ftp://host/x"); err == nil || !strings.Contains(err.Error(), `unsupported scheme "ftp"`) {
		t.Fatalf("ftp: %v", err)
	}
}
