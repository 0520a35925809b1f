package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
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

// TestOnlineRestoreBrokenObjectDownloadsNext: an online restore whose
// checkpoint has an object damaged in the store stops the process once —
// Pebble's background read panics, or the download's checksum fails the
// job — and leaves a marker in the data directory; the next start does not
// restore online again (that was a crash loop) but by download, which
// verifies every file first: it refuses the broken checkpoint by name and,
// with restore.fallback: previous, restores the one before. The outputs
// are exact.
func TestOnlineRestoreBrokenObjectDownloadsNext(t *testing.T) {
	h := newHarness(t, harnessConfig{op: opCount, store: "file", mode: "incremental", delivery: "exactly_once",
		interval: "1h", retain: 5, keys: 20000, restore: "{mode: online, fallback: previous}"})
	// Two checkpoints, each taken on a graceful stop: the second has SSTs
	// of its own (the first shares none of them).
	h.publish(6000)
	h.runToEnd()
	h.publish(3000)
	h.runToEnd()

	ctx := context.Background()
	store, err := checkpoint.OpenStore(ctx, h.store)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(ctx)
	ms, _, err := checkpoint.LoadIntact(ctx, store, "killed")
	if err != nil || len(ms) < 2 {
		t.Fatalf("checkpoints: %d, %v", len(ms), err)
	}
	latest, first := ms[len(ms)-1], map[string]bool{}
	for _, o := range ms[0].Objects {
		first[o.Path] = true
	}
	var victim checkpoint.Object
	for _, o := range latest.Objects {
		if o.Kind == checkpoint.KindSST && !first[o.Path] && o.Size > victim.Size {
			victim = o
		}
	}
	if victim.Path == "" {
		t.Fatal("the newest checkpoint has no SST of its own")
	}
	u, err := url.Parse(h.store)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(u.Path, filepath.FromSlash(victim.Path))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(b) / 4; i < len(b)/4+64; i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// A new node: online, until the broken object stops it.
	if err := os.RemoveAll(datadir.Checkpoints(h.data)); err != nil {
		t.Fatal(err)
	}
	mark := len(h.logs.String())
	cmd, done := h.start()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("the online restore of a broken checkpoint exited 0\n%s", tail(h.logs.String()[mark:], 4000))
		}
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("the online restore of a broken checkpoint still runs\n%s", tail(h.logs.String()[mark:], 4000))
	}
	if l := h.logs.String()[mark:]; !strings.Contains(l, "online restore: processing starts now") {
		t.Fatalf("the first start did not restore online\n%s", tail(l, 4000))
	}
	if _, err := os.Stat(filepath.Join(h.data, "online-restore-failed.json")); err != nil {
		t.Fatalf("no marker of the failed online restore: %v\n%s", err, tail(h.logs.String()[mark:], 4000))
	}

	// The next start downloads, refuses the broken checkpoint, falls back.
	mark = len(h.logs.String())
	h.runToEnd()
	l := h.logs.String()[mark:]
	for _, want := range []string{"restoring by download", "restore.fallback: previous", victim.Path} {
		if !strings.Contains(l, want) {
			t.Fatalf("the restart's log does not say %q\n%s", want, tail(l, 6000))
		}
	}
	if strings.Contains(l, "online restore: processing starts now") {
		t.Fatalf("the restart restored online again\n%s", tail(l, 6000))
	}
	if _, err := os.Stat(filepath.Join(h.data, "online-restore-failed.json")); !os.IsNotExist(err) {
		t.Fatalf("the marker outlived a verified restore: %v", err)
	}
	h.verify()
}

// TestOnlineRestorePrefetches: a job restarted online on a new node
// processes the input that came after its checkpoint while the state is
// still remote, reading each call's keys' state ahead together
// (state.DB.Prefetch; restore.prefetch: on, since on a local file store
// auto would measure misses too cheap to read ahead): the "fully local" log
// line counts the keys read ahead, and the outputs are exact.
func TestOnlineRestorePrefetches(t *testing.T) {
	// download_rate: slow enough that the records after the checkpoint
	// are processed while the state is remote, under any load.
	h := newHarness(t, harnessConfig{op: opCount, store: "file", mode: "incremental", delivery: "exactly_once", interval: "150ms",
		keys: 20000, restore: "{mode: online, download_rate: 32KiB, prefetch: on}"})
	h.publish(6000)
	mark := len(h.logs.String())
	cmd, done := h.start()
	wait.For(t, time.Minute, "a checkpoint of all 6000 events", func() bool {
		return h.outputsAtLeast(6000) && strings.Count(h.logs.String()[mark:], "checkpoint complete") >= 2
	})
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
	if err := os.RemoveAll(datadir.Checkpoints(h.data)); err != nil { // a new node
		t.Fatal(err)
	}
	h.publish(4000)
	h.closeInput()
	mark = len(h.logs.String())
	cmd, done = h.start()
	wait.For(t, time.Minute, "the online restore to be fully local", func() bool {
		return strings.Contains(h.logs.String()[mark:], "online restore: the state is fully local")
	})
	h.awaitEnd(cmd, done, mark)
	h.verify()
	l := h.logs.String()[mark:]
	if !strings.Contains(l, "online restore: processing starts now") {
		t.Fatalf("the restart did not restore online\n%s", tail(l, 4000))
	}
	m := regexp.MustCompile(`keys_prefetched=(\d+)`).FindStringSubmatch(l)
	if m == nil {
		t.Fatalf("no keys_prefetched in the fully-local line\n%s", tail(l, 4000))
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Fatalf("no key was prefetched while the state was remote\n%s", tail(l, 4000))
	}
	t.Logf("keys prefetched while the state was remote: %s (%s)", m[1], regexp.MustCompile(`bytes_remote_at_start=\d+`).FindString(l))
}
