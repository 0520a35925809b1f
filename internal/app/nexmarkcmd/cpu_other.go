//go:build !unix

package nexmarkcmd

import "time"

// cpuTime is unknown here: the bench reports events per CPU-second as "-".
func cpuTime() time.Duration { return 0 }
