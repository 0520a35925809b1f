// Package failpoint kills the process at named points of the checkpoint
// commit and of restore, for crash tests. It is inert unless the
// environment variable CAIRN_FAILPOINTS names a point; only tests set it.
//
//	CAIRN_FAILPOINTS=checkpoint-before-manifest        kill on the first hit
//	CAIRN_FAILPOINTS=restore-during-download@3,gc-x    kill on the 3rd hit; several points
//
// A hit point is a real crash: SIGKILL to the process itself, so no deferred
// function, no flush and no cleanup runs.
package failpoint

import (
	"os"
	"strconv"
	"strings"
	"sync"

	"cairn/internal/base/sysfile"
)

// EnvVar is the environment variable that arms failpoints.
const EnvVar = "CAIRN_FAILPOINTS"

// Names of the failpoints compiled into cairn.
const (
	CheckpointAfterUpload    = "checkpoint-after-upload"    // data uploaded, no manifest yet
	CheckpointBeforeManifest = "checkpoint-before-manifest" // manifest encoded, not written
	CheckpointAfterManifest  = "checkpoint-after-manifest"  // committed; retention not run
	GCAfterManifestDelete    = "gc-after-manifest-delete"   // a dropped checkpoint's manifest is gone, its files not yet
	RestoreDuringDownload    = "restore-during-download"    // some files fetched into the temp dir
	RestoreBeforeSwap        = "restore-before-swap"        // restored state built, not moved into place
	RestoreBeforeOpen        = "restore-before-open"        // about to open the restored Pebble DB
	// SavepointBuildBeforeManifest: a state tool's savepoint has its data
	// written, not its manifest.
	SavepointBuildBeforeManifest = "savepoint-build-before-manifest"
)

var (
	once  sync.Once
	mu    sync.Mutex
	armed map[string]int // name -> hit number that kills (1 = first)
	hits  map[string]int
)

func load() {
	armed, hits = map[string]int{}, map[string]int{}
	for _, p := range strings.Split(os.Getenv(EnvVar), ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		name, n := p, 1
		if i := strings.IndexByte(p, '@'); i > 0 {
			name = p[:i]
			if v, err := strconv.Atoi(p[i+1:]); err == nil && v > 0 {
				n = v
			}
		}
		armed[name] = n
	}
}

// Hit kills the process if the failpoint name is armed and this is the
// armed hit.
func Hit(name string) {
	once.Do(load)
	if len(armed) == 0 {
		return
	}
	mu.Lock()
	n, ok := armed[name]
	hits[name]++
	kill := ok && hits[name] == n
	mu.Unlock()
	if kill {
		os.Stderr.WriteString("cairn: failpoint " + name + " hit: killing the process\n")
		sysfile.KillSelf()
		select {} // wait for the signal
	}
}
