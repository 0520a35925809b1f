package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/group"
	"cairn/internal/app/job"
	"cairn/internal/testutil/natscluster"
	"cairn/internal/testutil/testbin"
	"cairn/internal/testutil/wait"
)

var groupRuns = flag.Bool("cairn.group", false, "run the group tests (cairn processes sharing a job over a three-node nats-server cluster; about a minute); .ci/run runs them")

// TestGroupMembers runs the two-sub-topology top-words graph as a group of
// cairn processes on a three-node NATS cluster (R3 input stream and group
// bucket) with a shared file store, then an S3 one, and changes the group under load: a
// member is SIGKILLed (the survivor takes its sub-topology over from the
// store), a member joins (an owner checkpoints a sub-topology and hands it
// over), a member stops gracefully (it hands everything over and exits 0),
// and the killed one comes back under its name. At the end every closed
// window's top 5 equals the model, each emitted once, and Cairn-Out is
// gap-free on the output and the repartition stream.
func TestGroupMembers(t *testing.T) {
	if !*groupRuns {
		t.Skip("a group of cairn processes on a three-node cluster: run with -cairn.group (.ci/run does)")
	}
	seed := graphSeed(t)
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	for i, kind := range []string{"file", "s3"} {
		t.Run(kind, func(t *testing.T) {
			groupMembersRun(t, bin, kind, rand.New(rand.NewPCG(seed, 36+uint64(i))))
		})
	}
}

// groupMembersRun is TestGroupMembers with a store of kind storeKind
// (killStore's).
func groupMembersRun(t *testing.T, bin, storeKind string, rng *rand.Rand) {
	g := newGroupRig(t, bin, storeKind, 2*time.Second)
	c, js, env, jobFile, members, member := g.c, g.js, g.env, g.jobFile, g.members, g.member
	alive := func() {
		for _, m := range members {
			m.alive()
		}
	}
	in := &lineInput{t: t, js: js, rng: rng, step: 5}

	a, b := member("a", 0), member("b", 1)
	a.start()
	b.start()
	st := waitGroupSettled(t, a, []string{"a", "b"}, 2)
	// cairn group status shows who runs what, by sub-topology name.
	cmd := exec.Command(bin, "group", "status", "--job", jobFile, "--nats", c.URL(1))
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "job topwords: 2 members") || !strings.Contains(string(out), "topwords.s1") {
		t.Fatalf("cairn group status: %v\n%s", err, out)
	}
	t.Logf("cairn group status:\n%s", out)
	in.publish(1500)
	time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)

	// A savepoint asked of one member is the group's: each sub-topology's
	// part is taken by its owner, under one name. Asked again, the name is
	// taken: refused, and the parts stay.
	code, body := groupSavepoint(t, a, "sp1")
	if code != http.StatusOK || !strings.Contains(body, `"sub_topologies"`) {
		t.Fatalf("group savepoint: HTTP %d %s", code, body)
	}
	t.Logf("group savepoint: %s", body)
	if code, body := groupSavepoint(t, b, "sp1"); code != http.StatusConflict {
		t.Fatalf("a second group savepoint of the same name: HTTP %d %s, want 409", code, body)
	}
	cmd = exec.Command(bin, "savepoint", "ls", "--job-file", jobFile)
	cmd.Env = env
	out, err = cmd.CombinedOutput()
	if err != nil || strings.Count(string(out), "sp1") != 2 || !strings.Contains(string(out), "topwords.s1") {
		t.Fatalf("cairn savepoint ls: %v, want sp1 once per sub-topology:\n%s", err, out)
	}
	// The status asks the members what they run: how far each got, its
	// lag and newest checkpoint, per sub-topology.
	cmd = exec.Command(bin, "group", "status", "--job", jobFile, "--nats", c.URL(2))
	cmd.Env = env
	out, err = cmd.CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^topwords +[ab] +\d+ +\d+ `).Match(out) || !regexp.MustCompile(`(?m)^topwords\.s1 +[ab] +\d+ +\d+ `).Match(out) {
		t.Fatalf("cairn group status: %v, want a row per sub-topology with its member, position and lag:\n%s", err, out)
	}
	t.Logf("cairn group status:\n%s", out)

	// SIGKILL the owner of the first sub-topology: the other one takes it
	// over from the store once its lease expires.
	victim := ownerOf(st, 0)
	other := map[string]string{"a": "b", "b": "a"}[victim]
	t0 := time.Now()
	members[victim].kill()
	t.Logf("killed %s (it ran sub-topologies %v)", victim, unitsOf(st, victim))
	if st = waitGroupSettled(t, members[other], []string{other}, 2); len(unitsOf(st, other)) != 2 {
		t.Fatalf("the survivor runs %v, want both sub-topologies", unitsOf(st, other))
	}
	t.Logf("takeover settled %v after the kill (lease TTL 2s)", time.Since(t0).Round(time.Millisecond))
	// The survivor's /api/group (its dashboard's group card) shows the
	// takeover: the sub-topology gained and running again (restored, when
	// the killed member had checkpointed it).
	wait.Until(t, 30*time.Second, "the takeover among the survivor's events", func() error {
		sv, err := groupStatus(members[other])
		if err != nil {
			return err
		}
		for _, e := range sv.Events {
			// Caught up: the backlog at its start worked off, after
			// running again.
			if slices.Contains(e.Gained, "topwords") && e.RunningAfter > 0 && e.Err == "" && e.CaughtUpAfter >= e.RunningAfter {
				t.Logf("the survivor's takeover event: running again after %v, caught up after %v (backlog %d records), restores %+v",
					e.RunningAfter.Round(time.Millisecond), e.CaughtUpAfter.Round(time.Millisecond), e.Backlog, e.Restores)
				return nil
			}
		}
		return fmt.Errorf("events %+v", sv.Events)
	})
	in.publish(1500)

	// A third member joins: it gets a sub-topology by a handoff.
	d := member("c", 2)
	d.start()
	st = waitGroupSettled(t, d, []string{other, "c"}, 2)
	if len(unitsOf(st, "c")) != 1 {
		t.Fatalf("the joiner runs %v, want one sub-topology", unitsOf(st, "c"))
	}
	time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)

	// The killed member comes back under its name; then a graceful stop
	// of another hands its sub-topology over.
	members[victim].start()
	waitGroupSettled(t, d, []string{"a", "b", "c"}, 2)

	in.publish(1000)
	time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)
	d.stop()
	if !strings.Contains(d.logs.String(), "group: left") {
		t.Fatalf("the stopped member did not leave the group:\n%s", tail(d.logs.String(), 3000))
	}
	delete(members, "c")
	st = waitGroupSettled(t, a, []string{"a", "b"}, 2)

	// SIGSTOP the owner of the second sub-topology with work in flight,
	// past its lease: the other takes it over. Resumed, the paused one
	// publishes nothing more (its lease check refuses: the output and the
	// repartition stream stay gap-free below), finds its lease lost, and
	// joins again.
	paused := ownerOf(st, 1)
	other = map[string]string{"a": "b", "b": "a"}[paused]
	in.publish(1500)
	time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
	if err := members[paused].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitGroupSettled(t, members[other], []string{other}, 2)
	time.Sleep(time.Second)
	if err := members[paused].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Seen through the paused member: if it exited instead of joining
	// again, the wait fails with its log.
	waitGroupSettled(t, members[paused], []string{"a", "b"}, 2)
	if !strings.Contains(members[paused].logs.String(), "lease lost") {
		t.Errorf("the paused member did not find its lease lost:\n%s", tail(members[paused].logs.String(), 3000))
	}
	t.Logf("paused %s past its lease; on resuming: %s", paused, firstLine(members[paused].logs.String(), "group: stopped publishing", "group: sub-topologies lost"))

	in.closeWindows()
	model := topWordsModel(in.lines, in.times, in.times[len(in.times)-1])
	waitTopWindows(t, js, model, 2*time.Minute, alive)

	// Restoring the group savepoint into the running group is refused;
	// once every member stopped, the first one started with it records
	// the restore for every sub-topology, whichever member runs it. The
	// replay from its positions regenerates outputs the streams hold:
	// still exact.
	restoreArgs := func(m *cairnBinary) func() {
		args := m.args
		m.args = func() []string { return append(args(), "--restore", "savepoint:sp1") }
		return func() { m.args = args }
	}
	x := g.member("x", 2)
	undo := restoreArgs(x)
	x.start()
	if err := <-x.done; err == nil || !strings.Contains(x.logs.String(), "not into a running group") {
		t.Fatalf("--restore savepoint into a running group: %v, want refused:\n%s", err, tail(x.logs.String(), 2000))
	}
	undo()
	delete(members, "x")
	for _, name := range []string{"a", "b"} {
		members[name].stop()
	}
	checkTopWords(t, js, model)
	for _, stream := range []string{"TOP", "CAIRN_RP_TOPWORDS_1"} {
		checkFenced(t, js, stream)
	}
	// The survivor ran the whole graph and wrote graph checkpoints; the
	// members that took its parts over removed each before dropping a
	// checkpoint it names.
	checkGraphCheckpointsRestorable(t, bin, g.jobFile, env)
	fromA, fromB := len(a.logs.String()), len(b.logs.String())
	undo = restoreArgs(a)
	a.start()
	undo()
	wait.Until(t, 30*time.Second, "the first member recording the savepoint's restore", func() error {
		if !strings.Contains(a.logs.String()[fromA:], "restores savepoint sp1 when it next starts") {
			return errors.New("not yet")
		}
		return nil
	})
	b.start()
	waitGroupSettled(t, a, []string{"a", "b"}, 2)
	wait.Until(t, time.Minute, "both sub-topologies restored from sp1 and checkpointed since", func() error {
		logs := a.logs.String()[fromA:] + b.logs.String()[fromB:]
		for _, sub := range []string{"topwords ", "topwords.s1 "} {
			if !strings.Contains(logs, `restored savepoint checkpointed: later starts restore the newest checkpoint" sub_topology=`+sub) {
				return fmt.Errorf("%s: not yet", sub)
			}
		}
		if n := strings.Count(logs, `savepoint=sp1`); n < 2 {
			return fmt.Errorf("%d restores of sp1", n)
		}
		return nil
	})
	wait.Until(t, time.Minute, "the replay from the savepoint caught up", func() error {
		st, err := groupStatus(a)
		if err != nil {
			return err
		}
		n := 0
		for _, m := range st.Members {
			for _, r := range m.Running {
				if r.Lag > 0 || r.StreamLastSeq == 0 {
					return fmt.Errorf("%s: lag %d of %d", r.Name, r.Lag, r.StreamLastSeq)
				}
				n++
			}
		}
		if n != 2 {
			return fmt.Errorf("%d sub-topologies reported: %+v", n, st.Members)
		}
		return nil
	})
	for _, name := range []string{"a", "b"} {
		members[name].stop()
	}
	// The repartition stream is not checked again: a replay from an older
	// savepoint republishes its watermark markers, earlier than those the
	// stream holds (docs/JOBS.md, restoring a checkpoint older than the
	// newest whose outputs were published).
	checkTopOutputs(t, js, model)
	t.Logf("after the restore of savepoint sp1: %d windows exact", len(model))
}

// checkFenced reads a stream a group wrote, whole and in order: every
// output carries its writer's epoch (Cairn-Epoch), each writer's subjects
// hold its newest claim (engine.FenceSubjects), and it counts outputs
// stored after a newer claim with a lower epoch: a stale writer's, within
// the stride before its next check was refused (a repartition reader
// drops them as repeats).
func checkFenced(t *testing.T, js jetstream.JetStream, stream string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	msgs := readStreamAll(t, ctx, js, stream, s.CachedInfo().State.Msgs, 1000)
	claim := map[string]uint64{} // writer's subject prefix -> epoch of its newest claim so far
	stale, outputs := 0, 0
	for _, m := range msgs {
		h := m.Headers()
		ep, err := strconv.ParseUint(h.Get(engine.HeaderEpoch), 10, 64)
		if err != nil {
			t.Fatalf("%s: %s without a valid %s: %v", stream, m.Subject(), engine.HeaderEpoch, h)
		}
		if f := h.Get(engine.HeaderFence); f != "" {
			if f == "claim" {
				w, _, _ := strings.Cut(m.Subject(), ".fence.")
				claim[w] = max(claim[w], ep)
			}
			continue
		}
		outputs++
		if ep < claim[m.Subject()[:strings.LastIndexByte(m.Subject(), '.')]] {
			stale++
		}
	}
	if len(claim) == 0 {
		t.Fatalf("%s: %d outputs and no writer's claim", stream, outputs)
	}
	t.Logf("%s: %d outputs, claims held %v; %d stored after a newer claim with a lower epoch", stream, outputs, claim, stale)
}

// checkGraphCheckpointsRestorable lists a stopped job graph's checkpoints
// with the binary and fails on a graph checkpoint naming a checkpoint
// that is gone: `--restore ID` would refuse it.
func checkGraphCheckpointsRestorable(t *testing.T, bin, jobFile string, env []string) {
	t.Helper()
	cmd := exec.Command(bin, "checkpoints", "ls", "--json", "--job-file", jobFile)
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("checkpoints ls: %v\n%s", err, stderr.String())
	}
	var ls struct {
		Graphs []checkpoint.GraphManifest `json:"graph_checkpoints"`
		Subs   []struct {
			Name        string `json:"name"`
			Checkpoints []struct {
				ID uint64 `json:"id"`
			} `json:"checkpoints"`
		} `json:"sub_topologies"`
	}
	if err := json.Unmarshal(out, &ls); err != nil {
		t.Fatalf("checkpoints ls: %v\n%s", err, out)
	}
	have := map[string][]uint64{}
	for _, s := range ls.Subs {
		for _, c := range s.Checkpoints {
			have[s.Name] = append(have[s.Name], c.ID)
		}
	}
	for _, g := range ls.Graphs {
		for _, p := range g.Parts {
			if !slices.Contains(have[p.Name], p.Checkpoint) {
				t.Errorf("graph checkpoint %d names %s:%d, which is gone (the chain holds %v)", g.ID, p.Name, p.Checkpoint, have[p.Name])
			}
		}
	}
	t.Logf("%d graph checkpoints checked against the chains", len(ls.Graphs))
}

// groupSavepoint asks member m for a savepoint of the group's job.
func groupSavepoint(t *testing.T, m *cairnBinary, name string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+m.httpAddr+"/api/action/savepoint?name="+name, nil)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// groupStatus is /api/group of a member.
func groupStatus(m *cairnBinary) (group.Status, error) {
	var st group.Status
	resp, err := http.Get("http://" + m.httpAddr + "/api/group")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("/api/group: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// waitGroupSettled waits until the group, as member m sees it, is exactly
// the members named, every one of the units assigned to one of them,
// nothing in handoff, each member running at least one unit when there are
// enough to go round.
func waitGroupSettled(t testing.TB, m *cairnBinary, names []string, units int) group.Status {
	t.Helper()
	var st group.Status
	wait.Until(t, time.Minute, fmt.Sprintf("the group to settle on %v", names), func() error {
		m.alive()
		var err error
		if st, err = groupStatus(m); err != nil {
			return err
		}
		var ids []string
		for _, ms := range st.Members {
			ids = append(ids, ms.ID)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, names) {
			return fmt.Errorf("members %v", ids)
		}
		n := 0
		for _, o := range st.Assignment.Ranges {
			if o.Next != "" {
				return fmt.Errorf("%s moving %s → %s", o.Sub, o.Owner, o.Next)
			}
			if !slices.Contains(names, o.Owner) {
				return fmt.Errorf("%s owned by %s", o.Sub, o.Owner)
			}
			n += o.Len()
		}
		if n != units {
			return fmt.Errorf("%d of %d units assigned", n, units)
		}
		for _, name := range names {
			if len(unitsOf(st, name)) == 0 && len(names) <= units {
				return fmt.Errorf("%s runs nothing", name)
			}
		}
		return nil
	})
	return st
}

// ownerOf is the member running sub-topology k.
func ownerOf(st group.Status, k int) string {
	for _, o := range st.Assignment.Ranges {
		if o.Sub == group.Units && k >= o.Lo && k < o.Hi {
			return o.Owner
		}
	}
	return ""
}

// unitsOf is the sub-topologies member runs.
func unitsOf(st group.Status, member string) []int { return st.Assignment.Units()[member] }

// firstLine is the first line of logs holding one of subs ("" none).
func firstLine(logs string, subs ...string) string {
	for _, l := range strings.Split(logs, "\n") {
		for _, s := range subs {
			if strings.Contains(l, s) {
				return l
			}
		}
	}
	return ""
}

// groupRig is a group test's setup: a three-node cluster with an R3 input
// stream, the top-words graph's job file with a group section, a store of
// the kind asked, and the members started on it (each with its own data
// directory, named and connected to a node of its own).
type groupRig struct {
	c        *natscluster.Cluster
	js       jetstream.JetStream
	env      []string
	jobFile  string
	dataRoot string
	bin      string
	tb       testing.TB
	members  map[string]*cairnBinary
}

func newGroupRig(tb testing.TB, bin, storeKind string, ttl time.Duration) *groupRig {
	return newGroupRigOn(tb, natscluster.Start(tb), bin, storeKind, ttl)
}

// newGroupRigOn is newGroupRig on cluster c.
func newGroupRigOn(tb testing.TB, c *natscluster.Cluster, bin, storeKind string, ttl time.Duration) *groupRig {
	g := &groupRig{c: c, bin: bin, tb: tb, dataRoot: tb.TempDir(), members: map[string]*cairnBinary{}}
	var err error
	if g.js, err = jetstream.New(g.c.Connect()); err != nil {
		tb.Fatal(err)
	}
	c.CreateStream(g.js, jetstream.StreamConfig{Name: "LINES", Subjects: []string{"lines.>"}, Storage: jetstream.FileStorage})
	store, env := killStore(tb, storeKind)
	g.env = env
	j := topWordsSpec(g.c.URL(0))
	j.Group = &job.Group{LeaseTTL: ttl, Replicas: 3}
	g.jobFile = filepath.Join(tb.TempDir(), "topwords.yaml")
	if err := os.WriteFile(g.jobFile, []byte(testJobYAML(tb, j, tb.TempDir(), store, 2)), 0o644); err != nil {
		tb.Fatal(err)
	}
	return g
}

// member is a member named name, connected to node node (not started).
func (g *groupRig) member(name string, node int) *cairnBinary {
	return g.memberVia(name, g.c.URL(node))
}

// memberVia is a member named name that connects to urls (not started).
func (g *groupRig) memberVia(name, urls string) *cairnBinary {
	m := &cairnBinary{t: g.tb, bin: g.bin, env: g.env}
	m.args = func() []string {
		return []string{"--job", g.jobFile, "--data", filepath.Join(g.dataRoot, name), "--member", name, "--nats", urls}
	}
	g.members[name] = m
	return m
}
