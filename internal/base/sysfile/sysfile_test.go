package sysfile

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TestIDAndLinks: a hard link shares its file's identity and raises its
// link count; another file has another identity.
func TestIDAndLinks(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no inode in os.FileInfo")
	}
	dir := t.TempDir()
	a, b, c := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")
	for _, p := range []string{a, c} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stat := func(p string) os.FileInfo {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	if n, ok := Links(stat(a)); !ok || n != 1 {
		t.Fatalf("links of a: %d, %v; want 1", n, ok)
	}
	if err := os.Link(a, b); err != nil {
		t.Fatal(err)
	}
	if n, ok := Links(stat(a)); !ok || n != 2 {
		t.Fatalf("links of a after a link: %d, %v; want 2", n, ok)
	}
	da, ia, _ := ID(stat(a))
	db, ib, _ := ID(stat(b))
	dc, ic, ok := ID(stat(c))
	if !ok || da != db || ia != ib {
		t.Fatalf("a link has another identity: %d/%d vs %d/%d", da, ia, db, ib)
	}
	if da == dc && ia == ic {
		t.Fatalf("two files share identity %d/%d", da, ia)
	}
}
