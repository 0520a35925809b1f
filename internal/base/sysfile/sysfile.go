// Package sysfile holds the few file-system calls whose form differs by
// operating system: a file's identity and link count, a sync of every file
// system, a non-blocking open flag, the process's own SIGKILL and a create
// that refuses to replace where there are no hard links. Elsewhere
// cairn uses only what package os offers on every system; where a system
// has no answer (Windows has no inode in os.FileInfo), the callers take the
// careful path that the ok result names.
package sysfile
