//go:build darwin || freebsd || netbsd || openbsd

package demo

import "golang.org/x/sys/unix"

const (
	getTermios = unix.TIOCGETA
	setTermios = unix.TIOCSETA
)
