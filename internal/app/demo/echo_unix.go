//go:build linux || darwin || freebsd || netbsd || openbsd

package demo

import (
	"os"

	"golang.org/x/sys/unix"
)

// noEcho turns off the terminal's echo of typed characters (the line
// editing stays: keys still arrive a line at a time, after Enter), so
// that what the presenter types never lands inside the status line the
// demo redraws in place; the demo prints each command itself. It returns
// the function that restores the terminal.
func noEcho(f *os.File) (restore func()) {
	fd := int(f.Fd())
	old, err := unix.IoctlGetTermios(fd, getTermios)
	if err != nil {
		return func() {}
	}
	t := *old
	t.Lflag &^= unix.ECHO
	if err := unix.IoctlSetTermios(fd, setTermios, &t); err != nil {
		return func() {}
	}
	return func() { _ = unix.IoctlSetTermios(fd, setTermios, old) }
}
