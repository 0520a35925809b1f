package e2e

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/internal/base/datadir"
	"cairn/internal/testutil/testbin"
)

var (
	soakFor    = flag.Duration("cairn.soak", 0, "run the reliability soak for this long (0: skip); .ci/run runs it bounded")
	soakReport = flag.String("cairn.soak-report", "", "write RELIABILITY.md-ready figures of the soak to this file")
)

// TestReliabilitySoak repeats the kill -9 invariant with random seeds and
// random configurations (builtin, store kind, checkpoint mode, delivery,
// kill count and timing; in half the rounds every restart also picks a slot
// count from 1 to 4, so the kills land in rescaled restores too; a third
// of the rounds run a job graph instead, picked at random: the top-words
// chain of two keyed sub-topologies, the orders ⋈ payments interval join
// or the clicks lookup join against a KV bucket, each through SIGKILLs
// with restarts on random slot counts per sub-topology, see
// soakGraphRound; and a quarter are broker rounds, a chain, graph or join
// through a nats-server restart, a reset and black hole, or a slow link,
// see soakBrokerRound; and an eighth, first, are group rounds, two or
// three members of a group on a three-node NATS cluster killed and paused
// past their leases, see soakGroupRound) until -cairn.soak elapses, and
// reports the figures. Each
// round is checked against the builtin's exact model (harness.verify), a
// graph round against its graph's (checkTopWords, checkJoined,
// checkEnriched); core delivery, which is at-least-once, against every
// model output arriving at least once and nothing else. Every round prints
// its seed and names its graph; rerun one with CAIRN_SOAK_SEED.
//
//	go test ./e2e -run TestReliabilitySoak -cairn.soak=30m -cairn.soak-report=RELIABILITY-run.md
func TestReliabilitySoak(t *testing.T) {
	if *soakFor <= 0 {
		t.Skip("the soak runs with -cairn.soak=DURATION (CI runs it bounded: see .ci/run)")
	}
	start := time.Now()
	type figures struct{ rounds, kills, messages, events, failed int }
	var f figures
	var lines []string
	for round := 0; time.Since(start) < *soakFor; round++ {
		seed := uint64(time.Now().UnixNano())
		if s := os.Getenv("CAIRN_SOAK_SEED"); s != "" {
			fmt.Sscan(s, &seed)
		}
		rng := rand.New(rand.NewPCG(seed, 42))
		op := harnessOps[rng.IntN(len(harnessOps))]
		store := []string{"file", "s3"}[rng.IntN(2)]
		mode := []string{"incremental", "full"}[rng.IntN(2)]
		delivery := []string{"exactly_once", "transactional", "dedupe", "core"}[rng.IntN(4)]
		kills := 2 + rng.IntN(5)
		rescale := rng.IntN(2) == 0
		// Online restore, with the local checkpoint copies removed before
		// half of the starts (a new node: the state comes from the store,
		// slowly enough that kills land while it is still remote).
		online := rng.IntN(2) == 0
		name := fmt.Sprintf("round%d-%s-%s-%s-%s", round, op, store, mode, delivery)
		if rescale {
			name += "-rescale"
		}
		if online {
			name += "-online"
		}
		if rng.IntN(8) == 0 {
			// A group round: members of a group on a NATS cluster
			// killed and paused past their leases.
			name = fmt.Sprintf("round%d-group-%s", round, store)
			var what string
			ok := t.Run(name, func(t *testing.T) {
				t.Logf("seed %d (rerun: CAIRN_SOAK_SEED=%d go test ./e2e -run 'TestReliabilitySoak' -cairn.soak=1s)", seed, seed)
				bin, err := testbin.Build("cairn", "cairn")
				if err != nil {
					t.Fatal(err)
				}
				var kills, msgs int
				what, kills, msgs = soakGroupRound(t, bin, rng, store)
				f.kills += kills
				f.messages += msgs
			})
			f.rounds++
			if !ok {
				f.failed++
				lines = append(lines, fmt.Sprintf("| %s (%s) | seed %d | **FAILED** |", name, what, seed))
			} else {
				lines = append(lines, fmt.Sprintf("| %s (%s) | seed %d | exact |", name, what, seed))
			}
			continue
		}
		if rng.IntN(4) == 0 {
			// A broker round: a chain, graph or join through a server
			// restart or a network fault.
			name = fmt.Sprintf("round%d-broker", round)
			var what string
			ok := t.Run(name, func(t *testing.T) {
				t.Logf("seed %d (rerun: CAIRN_SOAK_SEED=%d go test ./e2e -run 'TestReliabilitySoak' -cairn.soak=1s)", seed, seed)
				what = soakBrokerRound(t, rng)
			})
			f.rounds++
			if !ok {
				f.failed++
				lines = append(lines, fmt.Sprintf("| %s (%s) | seed %d | **FAILED** |", name, what, seed))
			} else {
				lines = append(lines, fmt.Sprintf("| %s (%s) | seed %d | exact |", name, what, seed))
			}
			continue
		}
		if rng.IntN(3) == 0 {
			// A job graph round: one of soakGraphs through SIGKILLs at
			// random slot counts per sub-topology.
			graph := soakGraphs[rng.IntN(len(soakGraphs))]
			name = fmt.Sprintf("round%d-graph-%s-%s-%s", round, graph, store, mode)
			ok := t.Run(name, func(t *testing.T) {
				t.Logf("seed %d (rerun: CAIRN_SOAK_SEED=%d go test ./e2e -run 'TestReliabilitySoak' -cairn.soak=1s)", seed, seed)
				bin, err := testbin.Build("cairn", "cairn")
				if err != nil {
					t.Fatal(err)
				}
				graphKills, msgs := soakGraphRound(t, bin, graph, rng, store, mode)
				f.kills += graphKills
				f.messages += msgs
			})
			f.rounds++
			if !ok {
				f.failed++
				lines = append(lines, fmt.Sprintf("| %s | seed %d | **FAILED** |", name, seed))
			} else {
				lines = append(lines, fmt.Sprintf("| %s | seed %d | exact |", name, seed))
			}
			continue
		}
		ok := t.Run(name, func(t *testing.T) {
			t.Logf("seed %d (rerun: CAIRN_SOAK_SEED=%d go test ./e2e -run 'TestReliabilitySoak' -cairn.soak=1s)", seed, seed)
			hc := harnessConfig{op: op, store: store, mode: mode, delivery: delivery, interval: fmt.Sprintf("%dms", 100+rng.IntN(400)), retain: 1 + rng.IntN(3)}
			if online {
				hc.restore = "{mode: online, download_rate: 256KiB}"
			}
			h := newHarness(t, hc)
			h.publish(3000 + rng.IntN(6000))
			for k := range kills {
				if rescale {
					h.args = []string{"--slots", fmt.Sprint(1 + rng.IntN(4))}
				}
				if online && rng.IntN(2) == 0 {
					if err := os.RemoveAll(datadir.Checkpoints(h.data)); err != nil {
						t.Fatal(err)
					}
				}
				cmd, done := h.start()
				time.Sleep(time.Duration(30+rng.IntN(1500)) * time.Millisecond)
				if k == kills/2 {
					h.publish(1000 + rng.IntN(4000))
				}
				_ = cmd.Process.Signal(syscall.SIGKILL)
				<-done
			}
			h.args = nil // the last run is at the job's 2 slots, which verify checks
			h.runToEnd()
			m := h.verify()
			f.messages += h.n
			f.events += m.events
			t.Logf("%s: %d events, %d outputs checked (%d logged ticks in the input)", op, m.events, m.outputs, m.ticks)
		})
		f.rounds++
		f.kills += kills
		if !ok {
			f.failed++
			lines = append(lines, fmt.Sprintf("| %s | seed %d | **FAILED** |", name, seed))
		} else {
			lines = append(lines, fmt.Sprintf("| %s | seed %d | exact |", name, seed))
		}
	}
	report := fmt.Sprintf("Soak of %s (started %s): %d rounds, %d SIGKILLs, %d input messages, %d events counted, %d failed rounds.\n\n| round | seed | result |\n|---|---|---|\n%s\n",
		time.Since(start).Round(time.Second), start.UTC().Format(time.RFC3339), f.rounds, f.kills, f.messages, f.events, f.failed, strings.Join(lines, "\n"))
	t.Log("\n" + report)
	if *soakReport != "" {
		if err := os.WriteFile(*soakReport, []byte(report), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
