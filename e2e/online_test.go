package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/internal/datadir"
	"cairn/internal/testutil/wait"
)

// TestOnlineRestoreKillNine runs the kill test's job with restore.mode
// online, as on a new node each time: before every restart the local
// checkpoint copies are removed, so the restore comes from the store, and
// the download is slow enough (download_rate) that kills land while the
// restored state is still read remotely. Each restart processes before its
// state is local; a kill in that phase restores again; the last run goes
// on until the state is fully local; the outputs are exact. File and S3
// stores.
func TestOnlineRestoreKillNine(t *testing.T) {
	seed := killSeed()
	for i, store := range []string{"file", "s3"} {
		t.Run(store, func(t *testing.T) {
			t.Logf("seed %d (rerun: CAIRN_KILL_SEED=%d go test ./e2e -run 'TestOnlineRestoreKillNine/%s' -count=1)", seed, seed, store)
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			h := newHarness(t, harnessConfig{op: opCount, store: store, mode: "incremental", delivery: "exactly_once", interval: "150ms",
				keys: 20000, restore: "{mode: online, download_rate: 128KiB}"})
			newNode := func() {
				if err := os.RemoveAll(datadir.Checkpoints(h.data)); err != nil {
					t.Fatal(err)
				}
			}
			h.publish(6000)
			kills := 0
			for k := range killsPerCase {
				newNode()
				// The third start scales up (online) and the fourth back down
				// (a download); the others keep 2 slots.
				h.args = []string{"--slots", fmt.Sprint(map[bool]int{true: 4, false: 2}[k == 2])}
				mark := len(h.logs.String())
				cmd, done := h.start()
				if k == 0 {
					// The first run has nothing to restore: kill it only once it
					// committed a checkpoint, so every restart restores one.
					wait.For(t, time.Minute, "the first checkpoint", func() bool {
						return strings.Contains(h.logs.String()[mark:], "checkpoint complete")
					})
				}
				time.Sleep(time.Duration(50+rng.IntN(1100)) * time.Millisecond)
				if k >= 1 && k <= 4 {
					h.publish(1500)
				}
				select {
				case err := <-done:
					t.Fatalf("cairn exited before the kill: %v\n%s", err, tail(h.logs.String(), 4000))
				default:
				}
				_ = cmd.Process.Signal(syscall.SIGKILL)
				<-done
				kills++
			}
			// The last run: from the store again, on until the state is
			// fully local, then to the end of the input.
			newNode()
			h.args = nil // the last run is at the job's 2 slots, which verify checks
			h.closeInput()
			mark := len(h.logs.String())
			cmd, done := h.start()
			wait.For(t, time.Minute, "the online restore to be fully local (or a scale-down's download)", func() bool {
				l := h.logs.String()[mark:]
				return strings.Contains(l, "online restore: the state is fully local") || strings.Contains(l, "online restore does not apply")
			})
			h.awaitEnd(cmd, done, mark)
			m := h.verify()
			logs := h.logs.String()
			online := strings.Count(logs, "online restore: processing starts now")
			refused := strings.Count(logs, "online restore does not apply")
			t.Logf("%d kills, %d events and %d outputs exact; %d of %d restarts restored online, %d downloaded (a scale-down)", kills, m.events, m.outputs, online, kills, refused)
			// Every restart restores (the first run checkpointed before its
			// kill): online, or by download for a scale-down; a kill can
			// also land before the restore said which.
			if online < 2 {
				t.Fatalf("%d restarts: %d online, %d downloaded\n%s", kills, online, refused, tail(logs, 4000))
			}
			if !strings.Contains(logs, "online restore: the state is fully local") && !strings.Contains(logs[mark:], "online restore does not apply") {
				t.Fatalf("no online restore reached fully local\n%s", tail(logs, 4000))
			}
			if strings.Contains(logs, "online restore: the download failed") {
				t.Fatalf("a download failed\n%s", tail(logs, 4000))
			}
		})
	}
}
