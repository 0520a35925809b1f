package sysfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// CreateNoReplace gives the complete file tmp the name dst unless dst
// exists, atomically: then it returns an error wrapping fs.ErrExist and
// leaves both files as they were. It is a hard link to dst, which leaves
// tmp as a second name for the caller to remove (a failed removal does
// not undo the create). A file system without hard links (FAT and exFAT, where
// link(2) fails with EPERM, a USB stick at the edge) gets, on Linux, a
// rename that refuses to replace (renameat2 RENAME_NOREPLACE), which they
// support; elsewhere the link's error is returned, saying so.
func CreateNoReplace(tmp, dst string) error {
	err := link(tmp, dst)
	if err == nil {
		return nil
	}
	if errors.Is(err, fs.ErrExist) || !linksUnsupported(err) {
		return err
	}
	rerr := renameNoReplace(tmp, dst)
	if rerr == nil || errors.Is(rerr, fs.ErrExist) {
		return rerr
	}
	return fmt.Errorf("%w; the file system has no hard links, and no rename that refuses to replace: %v", err, rerr)
}

// link is os.Link; a test replaces it to play a file system without hard
// links.
var link = os.Link

// linksUnsupported says a failed link(2) means the file system has no hard
// links (not that the call was wrong or the disk failed).
func linksUnsupported(err error) bool {
	return errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOTSUP) ||
		errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS)
}
