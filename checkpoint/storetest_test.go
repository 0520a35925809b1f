package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"testing"
	"time"

	"cairn/internal/testutil/testservers"
)

// testStore is the contract every Store implementation passes.
func testStore(t *testing.T, s Store) {
	ctx := context.Background()
	get := func(name string) []byte {
		t.Helper()
		b, err := readAll(ctx, s, name)
		if err != nil {
			t.Fatalf("get %s: %v", name, err)
		}
		return b
	}
	names := func(prefix string) []string {
		t.Helper()
		objs, err := listAll(ctx, s, prefix)
		if err != nil {
			t.Fatalf("list %q: %v", prefix, err)
		}
		var out []string
		for _, o := range objs {
			out = append(out, o.Name)
		}
		sort.Strings(out)
		return out
	}

	t.Run("PutGetStat", func(t *testing.T) {
		data := bytes.Repeat([]byte("0123456789"), 1000)
		before := time.Now().Add(-time.Minute)
		if err := s.Put(ctx, "a/b/obj1", bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		if got := get("a/b/obj1"); !bytes.Equal(got, data) {
			t.Fatalf("got %d bytes, want %d", len(got), len(data))
		}
		st, err := s.Stat(ctx, "a/b/obj1")
		if err != nil {
			t.Fatal(err)
		}
		if st.Size != int64(len(data)) || st.Name != "a/b/obj1" {
			t.Fatalf("stat = %+v", st)
		}
		if st.ModTime.Before(before) || st.ModTime.After(time.Now().Add(time.Minute)) {
			t.Fatalf("mod time %v not about now", st.ModTime)
		}
		// Put replaces.
		if err := s.Put(ctx, "a/b/obj1", bytes.NewReader([]byte("short"))); err != nil {
			t.Fatal(err)
		}
		if got := get("a/b/obj1"); string(got) != "short" {
			t.Fatalf("after overwrite got %q", got)
		}
		// Empty object.
		if err := s.Put(ctx, "a/empty", bytes.NewReader(nil)); err != nil {
			t.Fatal(err)
		}
		if got := get("a/empty"); len(got) != 0 {
			t.Fatalf("empty object has %d bytes", len(got))
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		if _, err := s.Get(ctx, "nope/x"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get missing: %v", err)
		}
		if _, err := s.GetRange(ctx, "nope/x", 0, 1); !errors.Is(err, ErrNotFound) {
			t.Fatalf("range missing: %v", err)
		}
		if _, err := s.Stat(ctx, "nope/x"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("stat missing: %v", err)
		}
		if err := s.Delete(ctx, "nope/x"); err != nil {
			t.Fatalf("delete missing: %v", err)
		}
	})

	t.Run("Range", func(t *testing.T) {
		data := make([]byte, 10000)
		for i := range data {
			data[i] = byte(i * 7)
		}
		if err := s.Put(ctx, "r/obj", bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ off, n int64 }{{0, 1}, {0, 10000}, {1234, 100}, {9999, 1}, {5000, -1}} {
			rc, err := s.GetRange(ctx, "r/obj", c.off, c.n)
			if err != nil {
				t.Fatalf("range %v: %v", c, err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			end := c.off + c.n
			if c.n < 0 {
				end = int64(len(data))
			}
			if !bytes.Equal(got, data[c.off:end]) {
				t.Fatalf("range %v: got %d bytes, want %d", c, len(got), end-c.off)
			}
		}
	})

	t.Run("CreateIfAbsent", func(t *testing.T) {
		if err := s.Create(ctx, "c/MANIFEST.json", []byte("one")); err != nil {
			t.Fatal(err)
		}
		err := s.Create(ctx, "c/MANIFEST.json", []byte("two"))
		if !errors.Is(err, ErrExists) {
			t.Fatalf("second create: %v, want ErrExists", err)
		}
		if got := get("c/MANIFEST.json"); string(got) != "one" {
			t.Fatalf("manifest overwritten: %q", got)
		}
	})

	t.Run("CreateRace", func(t *testing.T) {
		var wg sync.WaitGroup
		results := make([]error, 8)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = s.Create(ctx, "race/MANIFEST.json", []byte(fmt.Sprint("writer-", i)))
			}()
		}
		wg.Wait()
		won := -1
		for i, err := range results {
			switch {
			case err == nil:
				if won >= 0 {
					t.Fatalf("writers %d and %d both created the object", won, i)
				}
				won = i
			case !errors.Is(err, ErrExists):
				t.Fatalf("writer %d: %v", i, err)
			}
		}
		if won < 0 {
			t.Fatal("no writer created the object")
		}
		if got := get("race/MANIFEST.json"); string(got) != fmt.Sprint("writer-", won) {
			t.Fatalf("content %q, winner was %d", got, won)
		}
	})

	t.Run("ListDelete", func(t *testing.T) {
		for _, n := range []string{"l/x/1", "l/x/2", "l/xy/3", "l/y/4", "lz"} {
			if err := s.Put(ctx, n, bytes.NewReader([]byte(n))); err != nil {
				t.Fatal(err)
			}
		}
		want := func(prefix string, exp ...string) {
			t.Helper()
			if got := names(prefix); fmt.Sprint(got) != fmt.Sprint(exp) {
				t.Fatalf("list %q = %v, want %v", prefix, got, exp)
			}
		}
		want("l/", "l/x/1", "l/x/2", "l/xy/3", "l/y/4")
		want("l/x", "l/x/1", "l/x/2", "l/xy/3")
		want("l/x/", "l/x/1", "l/x/2")
		want("l/none/")
		objs, _ := listAll(ctx, s, "l/y/")
		if len(objs) != 1 || objs[0].Size != 5 || objs[0].ModTime.IsZero() {
			t.Fatalf("list info %+v", objs)
		}
		if err := s.Delete(ctx, "l/x/1"); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, "l/y/4"); err != nil {
			t.Fatal(err)
		}
		want("l/", "l/x/2", "l/xy/3")
		if _, err := s.Stat(ctx, "l/x/1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("stat deleted: %v", err)
		}
		// A deleted name can be written again, also via Create.
		if err := s.Create(ctx, "l/y/4", []byte("again")); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("InvalidNames", func(t *testing.T) {
		for _, n := range []string{"", "/abs", "a/../b", "../x", "a//b", "dir/"} {
			if err := s.Put(ctx, n, bytes.NewReader(nil)); err == nil {
				t.Errorf("put %q accepted", n)
			}
		}
	})
}

func TestFileStoreContract(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(context.Background(), "file://"+dir+"/store?create_dir=true")
	if err != nil {
		t.Fatal(err)
	}
	testStore(t, s)
}

func TestFileStoreNeedsCreateDir(t *testing.T) {
	if _, err := OpenStore(context.Background(), "file://"+t.TempDir()+"/missing"); err == nil {
		t.Fatal("opened a missing directory without create_dir")
	}
}

func TestMemStoreContract(t *testing.T) {
	testStore(t, newMemStore(time.Now))
}

func TestGoFakeS3StoreContract(t *testing.T) {
	url := testservers.StartGoFakeS3(t)
	s, err := OpenStore(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	testStore(t, s)
	t.Run("Prefix", func(t *testing.T) {
		p, err := OpenStore(context.Background(), withPrefix(url, "base/dir"))
		if err != nil {
			t.Fatal(err)
		}
		testStore(t, p)
	})
}

func TestVersityGWStoreContract(t *testing.T) {
	url := testservers.StartVersityGW(t)
	s, err := OpenStore(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	testStore(t, s)
}

// withPrefix inserts a key prefix into an s3:// URL.
func withPrefix(url, prefix string) string {
	i := bytes.IndexByte([]byte(url), '?')
	return url[:i] + "/" + prefix + url[i:]
}

// testConditionalPut checks that the server itself refuses a second
// If-None-Match: * PUT (without blobStore.Create's HEAD in front).
func testConditionalPut(t *testing.T, s Store) {
	bs := s.(*RetryStore).s.(*blobStore)
	ctx := context.Background()
	if err := bs.Put(ctx, "cond/obj", bytes.NewReader([]byte("first"))); err != nil {
		t.Fatal(err)
	}
	err := bs.write(ctx, "cond/obj", bytes.NewReader([]byte("second")), true)
	if err == nil {
		t.Fatal("server accepted a conditional PUT over an existing object")
	}
	if err := bs.wrap("create", "cond/obj", err); !errors.Is(err, ErrExists) {
		t.Fatalf("conditional PUT error %v does not map to ErrExists", err)
	}
}

func TestS3ConditionalPutHonoured(t *testing.T) {
	for name, start := range map[string]func(testing.TB) string{
		"gofakes3":  testservers.StartGoFakeS3,
		"versitygw": testservers.StartVersityGW,
	} {
		t.Run(name, func(t *testing.T) {
			s, err := OpenStore(context.Background(), start(t))
			if err != nil {
				t.Fatal(err)
			}
			testConditionalPut(t, s)
		})
	}
}
