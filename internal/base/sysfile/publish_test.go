package sysfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
)

// TestCreateNoReplace: the file takes the name when it is free and is
// refused (fs.ErrExist, both files kept) when it is not; with hard links,
// and on Linux also on a file system without them (link(2) fails with
// EPERM, as on FAT and exFAT, played by replacing the link call).
func TestCreateNoReplace(t *testing.T) {
	for _, noLinks := range []bool{false, true} {
		if noLinks {
			if runtime.GOOS != "linux" {
				continue
			}
			calls := 0
			link = func(a, b string) error {
				calls++
				return &os.LinkError{Op: "link", Old: a, New: b, Err: syscall.EPERM}
			}
			defer func() { link = os.Link }()
			defer func() {
				if calls == 0 {
					t.Error("the link was never tried")
				}
			}()
		}
		dir := t.TempDir()
		tmp, dst := filepath.Join(dir, "tmp"), filepath.Join(dir, "MANIFEST")
		write := func(p, s string) {
			if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write(tmp, "first")
		if err := CreateNoReplace(tmp, dst); err != nil {
			t.Fatalf("no links %v: %v", noLinks, err)
		}
		if b, err := os.ReadFile(dst); err != nil || string(b) != "first" {
			t.Fatalf("no links %v: dst %q, %v", noLinks, b, err)
		}
		if err := os.Remove(tmp); noLinks && !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("no links: the rename left tmp: %v", err)
		}
		write(tmp, "second")
		if err := CreateNoReplace(tmp, dst); !errors.Is(err, fs.ErrExist) {
			t.Fatalf("no links %v: a second create: %v, want fs.ErrExist", noLinks, err)
		}
		if b, _ := os.ReadFile(dst); string(b) != "first" {
			t.Fatalf("no links %v: dst replaced: %q", noLinks, b)
		}
		if b, _ := os.ReadFile(tmp); string(b) != "second" {
			t.Fatalf("no links %v: tmp lost: %q", noLinks, b)
		}
	}
}

// TestCreateNoReplaceOtherLinkErrors: a link error that does not mean "no
// hard links here" (a missing source) is returned as it is.
func TestCreateNoReplaceOtherLinkErrors(t *testing.T) {
	dir := t.TempDir()
	err := CreateNoReplace(filepath.Join(dir, "missing"), filepath.Join(dir, "dst"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%v, want fs.ErrNotExist", err)
	}
}
