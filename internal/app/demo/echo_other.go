//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package demo

import "os"

// noEcho does nothing where the terminal's echo cannot be turned off.
func noEcho(*os.File) (restore func()) { return func() {} }
