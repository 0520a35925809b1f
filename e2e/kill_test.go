package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestKillNine kills the cairn binary with SIGKILL at random moments while
// it processes a known keyed input, restarts it each time (it restores the
// latest checkpoint), and checks at the end the outputs against the exact
// model of the builtin (see harness.expected): exactly one output per
// (key group, output index) with no gap, per key exactly the model's
// outputs in order, and for count the state too.
//
// Every run covers every builtin (count, split -> count, window_count by
// event time and by processing time, dedupe with a TTL: a seeded
// permutation over the five cases) and every delivery that promises
// exactly-once effect (exactly_once, dedupe, transactional; core is
// at-least-once, checked by the soak). Seeded: set CAIRN_KILL_SEED to rerun
// a failure.
func TestKillNine(t *testing.T) {
	seed := killSeed()
	t.Logf("seed %d (rerun: CAIRN_KILL_SEED=%d go test ./e2e -run TestKillNine -count=1)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 99))
	ops := append([]string(nil), harnessOps...)
	rng.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	kills, ran, events := 0, 0, 0
	cases := []struct {
		store, mode, delivery, interval string
		dupWindow                       time.Duration
	}{
		{"file", "incremental", "exactly_once", "150ms", 0},
		{"file", "full", "transactional", "150ms", 0},
		{"s3", "incremental", "dedupe", "150ms", 0},
		{"s3", "full", []string{"exactly_once", "transactional", "dedupe"}[rng.IntN(3)], "150ms", 0},
		// A checkpoint older than the output stream's duplicate window: the
		// replay regenerates outputs the server no longer remembers ids of
		// (so not dedupe delivery, which relies on those ids).
		{"file", "incremental", []string{"exactly_once", "transactional"}[rng.IntN(2)], "2500ms", 500 * time.Millisecond},
	}
	for i, tc := range cases {
		op := ops[i]
		name := fmt.Sprintf("%s-%s-%s-%s", op, tc.store, tc.mode, tc.delivery)
		if tc.dupWindow > 0 {
			name += "-old-checkpoint"
		}
		t.Run(name, func(t *testing.T) {
			ran++
			t.Logf("seed %d (rerun: CAIRN_KILL_SEED=%d go test ./e2e -run 'TestKillNine/%s' -count=1)", seed, seed, name)
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			h := newHarness(t, harnessConfig{op: op, store: tc.store, mode: tc.mode, delivery: tc.delivery, interval: tc.interval, dupWindow: tc.dupWindow})
			kills += killCase(t, rng, h)
			m := h.verify()
			events += m.events
			t.Logf("%s: %d events, %d outputs exact (%d logged ticks in the input)", op, m.events, m.outputs, m.ticks)
		})
	}
	t.Logf("%d SIGKILLs in total, %d events counted exactly", kills, events)
	// The issue asks for at least 30 kills per CI run (a -run selecting
	// some cases runs fewer).
	if ran == len(cases) && kills < 30 && !t.Failed() {
		t.Fatalf("only %d kills in %d cases", kills, ran)
	}
}

// killCase publishes half the input, then kills the job killsPerCase times
// at random moments while the rest arrives in parts, and runs it to the
// end. It returns the number of kills.
func killCase(t *testing.T, rng *rand.Rand, h *harness) int {
	h.publish(6000)
	kills := 0
	for k := range killsPerCase {
		cmd, done := h.start()
		// Early kills land in the restore, later ones in ingest or upload.
		time.Sleep(time.Duration(50+rng.IntN(1100)) * time.Millisecond)
		if k >= 1 && k <= 4 {
			h.publish(1500) // the rest of the input arrives while it runs
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
	h.runToEnd()
	return kills
}

// killsPerCase: 5 cases x 6 = 30 SIGKILLs per run.
const killsPerCase = 6

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// killSeed is a kill test's seed: CAIRN_KILL_SEED to rerun a failure, else
// the clock.
func killSeed() uint64 {
	if s := os.Getenv("CAIRN_KILL_SEED"); s != "" {
		if seed, err := strconv.ParseUint(s, 10, 64); err == nil {
			return seed
		}
	}
	return uint64(time.Now().UnixNano())
}
