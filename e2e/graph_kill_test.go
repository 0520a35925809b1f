package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"cairn/internal/app/runtime"
	"cairn/internal/testutil/wait"
)

// TestJobGraphKillNine runs the two-sub-topology top-words graph as the
// cairn binary, kills it with SIGKILL at random moments while it works
// through its input, restarts it each time on random slot counts (1-4, for
// each sub-topology), and at the end checks every closed window's top 5
// against the model: exact, each emitted once, Cairn-Out gap-free on the
// output and on the repartition stream. File store with incremental
// checkpoints on the embedded server, and S3 with full ones on an external
// nats-server.
func TestJobGraphKillNine(t *testing.T) {
	forKillCases(t, 0, graphKillRun)
}

// graphKillCase is graphKillRun on the NATS server at url with a store of
// kind storeKind; it returns the kills (the reliability soak's entry).
func graphKillCase(t *testing.T, bin, url string, rng *rand.Rand, storeKind, mode string) int {
	c := &cairnBinary{t: t, bin: bin}
	k := killConfig{url: url, mode: mode, rng: rng}
	k.store, c.env = killStore(t, storeKind)
	graphKillRun(t, c, k)
	return c.kills
}

// graphKillRun is one case of TestJobGraphKillNine.
func graphKillRun(t *testing.T, c *cairnBinary, k killConfig) {
	rng := k.rng
	_, js := connectJS(t, k.url)
	createStream(t, js, "LINES", "lines.>")
	jobFile := writeJob(t, "topwords.yaml", topWordsJob(t, k.url, t.TempDir(), k.store, 2), k.mode)
	// Each sub-topology on its own random slot count; the last two starts
	// go back to a random graph checkpoint (--restore ID), not the latest.
	restore := ""
	c.args = func() []string {
		a := []string{"--job", jobFile, "--stage-slots", fmt.Sprintf("count=%d,top=%d", 1+rng.IntN(4), 1+rng.IntN(4))}
		if restore != "" {
			a, restore = append(a, "--restore", restore), ""
		}
		return a
	}
	in := &lineInput{t: t, js: js, rng: rng, step: 5}
	in.publish(1500)
	for i := range 5 {
		if i == 4 {
			restore = pickGraphCheckpoint(t, c, k.store, rng)
		}
		c.start()
		time.Sleep(time.Duration(150+rng.IntN(900)) * time.Millisecond)
		if i == 2 {
			in.publish(1500) // more input arrives while it runs
		}
		c.kill()
	}
	// The last run: a line far in the future closes every earlier window.
	in.closeWindows()
	model := topWordsModel(in.lines, in.times, in.times[len(in.times)-1])
	restore = pickGraphCheckpoint(t, c, k.store, rng)
	c.start()
	waitTopWindows(t, js, model, 2*time.Minute, c.alive)
	// The repartition stream is purged below what no restore needs, once
	// both sub-topologies have committed enough checkpoints in this process.
	wait.Until(t, time.Minute, "a purge of the repartition stream", func() error {
		st, err := js.Stream(context.Background(), "CAIRN_RP_TOPWORDS_1")
		if err != nil {
			return err
		}
		info, err := st.Info(context.Background())
		if err != nil {
			return err
		}
		if info.State.FirstSeq <= 1 {
			return fmt.Errorf("first sequence %d", info.State.FirstSeq)
		}
		return nil
	})
	// /metrics has each sub-topology's figures.
	wait.Until(t, 30*time.Second, "per-sub-topology metrics", func() error {
		resp, err := http.Get("http://" + c.httpAddr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, want := range []string{`cairn_subtopology_records_out_total{sub_topology="topwords"}`, `cairn_subtopology_records_in_total{sub_topology="topwords.s1"}`, `cairn_subtopology_lag_messages{sub_topology="topwords.s1"}`} {
			if !strings.Contains(string(body), want) {
				return fmt.Errorf("no %s in /metrics", want)
			}
		}
		return nil
	})
	// /api/stats has every sub-topology's engine figures, each counting.
	wait.Until(t, 30*time.Second, "per-sub-topology stats", func() error {
		resp, err := http.Get("http://" + c.httpAddr + "/api/stats")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var st runtime.StatsAnswer
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return err
		}
		if len(st.SubTopologies) != 2 || st.SubTopologies[0].Name != "topwords" || st.SubTopologies[1].Name != "topwords.s1" {
			return fmt.Errorf("sub-topologies %+v", st.SubTopologies)
		}
		if g := st.GraphCheckpoint; g == nil || len(g.Parts) != 2 || g.Parts[1].Name != "topwords.s1" {
			return fmt.Errorf("graph checkpoint %+v", g)
		}
		for _, s := range st.SubTopologies {
			if s.RecordsIn == 0 || s.RecordsOut == 0 {
				return fmt.Errorf("%s: in %d, out %d", s.Name, s.RecordsIn, s.RecordsOut)
			}
		}
		return nil
	})
	// A savepoint over HTTP covers every sub-topology.
	req, _ := http.NewRequest(http.MethodPost, "http://"+c.httpAddr+"/api/action/savepoint?name=g1", nil)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var sp struct {
		SubTopologies []struct {
			ID        uint64 `json:"id"`
			Savepoint string `json:"savepoint"`
		} `json:"sub_topologies"`
	}
	if err := json.Unmarshal(body, &sp); err != nil || resp.StatusCode != http.StatusOK || len(sp.SubTopologies) != 2 || sp.SubTopologies[1].Savepoint != "g1" {
		t.Fatalf("savepoint action: %d %s (%v)", resp.StatusCode, body, err)
	}
	c.stop()
	checkTopWords(t, js, model)
	st, err := js.Stream(context.Background(), "CAIRN_RP_TOPWORDS_1")
	if err != nil {
		t.Fatal(err)
	}
	info, _ := st.Info(context.Background())
	t.Logf("repartition stream after the purges: first sequence %d, %d messages left", info.State.FirstSeq, info.State.Msgs)
}

// freeAddr is a 127.0.0.1 address with a port free a moment ago.
func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// lockedBuffer is syncBuffer (dashboard_test.go), by its older name.
type lockedBuffer = syncBuffer

// pickGraphCheckpoint returns a random graph checkpoint of the top-words
// graph from `cairn checkpoints ls --json` ("" when there is none yet).
func pickGraphCheckpoint(t *testing.T, c *cairnBinary, store string, rng *rand.Rand) string {
	t.Helper()
	cmd := exec.Command(c.bin, "checkpoints", "ls", "--json", "--store", store, "--job", "topwords")
	cmd.Env = c.env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil && strings.Contains(stderr.String(), "no checkpoint or savepoint") {
		t.Logf("no checkpoint yet: the restart restores nothing (%s)", strings.TrimSpace(stderr.String()))
		return ""
	}
	if err != nil {
		t.Fatalf("checkpoints ls: %v\n%s%s", err, out, stderr.String())
	}
	var ls struct {
		Graphs []struct {
			ID uint64 `json:"id"`
		} `json:"graph_checkpoints"`
	}
	if err := json.Unmarshal(out, &ls); err != nil {
		t.Fatalf("checkpoints ls: %v\n%s", err, out)
	}
	if len(ls.Graphs) == 0 {
		t.Logf("no graph checkpoint yet: the restart restores the latest")
		return ""
	}
	id := fmt.Sprint(ls.Graphs[rng.IntN(len(ls.Graphs))].ID)
	t.Logf("restart restores graph checkpoint %s (of %d)", id, len(ls.Graphs))
	return id
}
