package sysfile

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// renameNoReplace renames old to new unless new exists (an error wrapping
// fs.ErrExist); errors.ErrUnsupported where the file system cannot.
func renameNoReplace(oldPath, newPath string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldPath, unix.AT_FDCWD, newPath, unix.RENAME_NOREPLACE)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("renameat2 %s %s: %w", oldPath, newPath, errors.ErrUnsupported)
	}
	return &os.LinkError{Op: "renameat2", Old: oldPath, New: newPath, Err: err}
}
