package checkpoint

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestStoreURLFragment: a '#' pasted into a file:// URL would cut the
// path short (a URL fragment) and open the directory before it; it is
// refused, naming the escape. The URL FileStoreURL builds for such a
// directory opens it.
func TestStoreURLFragment(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run#2")
	for _, raw := range []string{"file://" + dir + "?create_dir=true", "file://" + dir + "#", "file://" + filepath.Dir(dir) + "/#"} {
		_, err := OpenStore(context.Background(), raw)
		if !errors.Is(err, ErrStoreURL) || !strings.Contains(err.Error(), "%23") {
			t.Errorf("%s: %v, want ErrStoreURL naming %%23", raw, err)
		}
	}
	u, err := FileStoreURL(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	s, err := OpenStore(context.Background(), u)
	if err != nil {
		t.Fatalf("%s: %v", u, err)
	}
	defer s.Close(context.Background())
	if err := s.Put(context.Background(), "x", strings.NewReader("y")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
}
