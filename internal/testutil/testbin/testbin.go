// Package testbin builds the binaries that tests run as separate processes
// (cairn itself, nats-server) from Go modules already in the build list, so a
// fresh machine with only Go runs every test: no root, no package manager.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

var (
	mu    sync.Mutex
	built = map[string]string{}
	dir   string
)

// Build builds the main package pkg (an import path such as "cairn" or
// "github.com/nats-io/nats-server/v2") once per test process and returns the
// binary's path.
func Build(pkg, name string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[pkg]; ok {
		return p, nil
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "cairn-testbin-")
		if err != nil {
			return "", err
		}
		dir = d
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	built[pkg] = out
	return out, nil
}

// Cleanup removes the built binaries; call it from TestMain after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		os.RemoveAll(dir)
	}
}
