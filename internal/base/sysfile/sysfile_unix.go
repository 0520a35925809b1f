//go:build unix

package sysfile

import (
	"os"
	"syscall"
)

// HasID says ID answers on this system.
const HasID = true

// NonBlock is the open flag that makes opening a FIFO return at once.
const NonBlock = syscall.O_NONBLOCK

// ID is a file's device and inode number.
func ID(fi os.FileInfo) (dev, ino uint64, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return uint64(st.Dev), uint64(st.Ino), true
}

// Links is a file's hard-link count.
func Links(fi os.FileInfo) (uint64, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return uint64(st.Nlink), true
}

// SyncAll asks the kernel to write back every file system's dirty data.
func SyncAll() { syscall.Sync() }

// KillSelf sends the process SIGKILL: no deferred call, no flush.
func KillSelf() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }

// Allocated is the disk space a file takes: its blocks, not its length.
func Allocated(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512
	}
	return fi.Size()
}
