//go:build !linux

package sysfile

import "errors"

// renameNoReplace: no rename that refuses to replace is used here.
func renameNoReplace(oldPath, newPath string) error { return errors.ErrUnsupported }
