package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/internal/app/group"
	"cairn/internal/testutil/testbin"
	"cairn/internal/testutil/wait"
)

// TestDemoGroup runs `cairn demo --members 3` (three member processes of
// the word count on the three-node cluster the demo embeds), kills one
// member through the dashboard's kill-member action (the button's
// request), and sees the takeover: another member gains what the killed
// one ran and runs it again, in the group card's events (the demo's
// /api/group) and in the demo's story. The killed member comes back on
// its own; then SIGINT ends the demo, whose final check must find every
// output exactly once.
func TestDemoGroup(t *testing.T) {
	if !*groupRuns {
		t.Skip("cairn demo --members 3: run with -cairn.group (.ci/run does)")
	}
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	p := &demoProc{done: make(chan error, 1)}
	p.cmd = exec.Command(bin, "demo", "--members", "3", "--data", t.TempDir(), "--http", "127.0.0.1:0", "--rate", "50", "--vocabulary", "500")
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
	})
	alive := func() error {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("the demo exited (%v):\n%s", err, tail(p.out.String(), 6000))
		default:
		}
		return nil
	}
	dash := regexp.MustCompile(`dashboard (http://127\.0\.0\.1:\d+)/`)
	var base string
	wait.Until(t, time.Minute, "the dashboard's address", func() error {
		_ = alive()
		m := dash.FindStringSubmatch(p.out.String())
		if m == nil {
			return fmt.Errorf("output %q", p.out.String())
		}
		base = m[1]
		return nil
	})
	wait.Until(t, time.Minute, "the demo to say what runs", func() error {
		_ = alive()
		if out := p.out.String(); !strings.Contains(out, "3 cairn member processes") || !strings.Contains(out, "3-node NATS cluster") {
			return fmt.Errorf("output %q", out)
		}
		return nil
	})
	// Every member runs one of the three sub-topologies.
	var st group.Status
	wait.Until(t, 3*time.Minute, "each member running a sub-topology", func() error {
		_ = alive()
		if st, err = demoGroupStatus(base); err != nil {
			return err
		}
		if len(st.Members) != 3 {
			return fmt.Errorf("members %+v", st.Members)
		}
		for _, m := range st.Members {
			if n := len(unitsOf(st, m.ID)); n != 1 {
				return fmt.Errorf("%s runs %d sub-topologies", m.ID, n)
			}
		}
		return nil
	})
	// Some outputs (and checkpoints, every 2 s) before the kill.
	time.Sleep(6 * time.Second)

	resp, err := http.Post(base+"/api/action/kill-member", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("kill-member: %s: %s", resp.Status, b)
	}
	var victim string
	if _, err := fmt.Sscanf(string(b), "killed %s", &victim); err != nil {
		t.Fatalf("kill-member answered %q", b)
	}
	lost := unitsOf(st, victim)
	t.Logf("kill-member: %s", strings.TrimSpace(string(b)))

	// The group card's events: another member gained what the victim ran
	// and runs it again.
	wait.Until(t, 2*time.Minute, "the takeover among the group's events", func() error {
		_ = alive()
		s, err := demoGroupStatus(base)
		if err != nil {
			return err
		}
		for _, e := range s.Events {
			if e.Member != "" && e.Member != victim && len(e.Gained) > 0 && e.RunningAfter > 0 && e.Err == "" && len(lost) == 1 &&
				slices.Contains(e.Gained, demoSubName(lost[0])) {
				t.Logf("takeover event: %s gained %v, running again after %v, restores %+v", e.Member, e.Gained, e.RunningAfter, e.Restores)
				return nil
			}
		}
		return fmt.Errorf("events %+v", s.Events)
	})
	wait.Until(t, time.Minute, "the demo's story to tell the takeover", func() error {
		_ = alive()
		if !strings.Contains(p.out.String(), "takeover: ") {
			return fmt.Errorf("no takeover line yet")
		}
		return nil
	})
	// The killed member restarts by itself and the group takes it in.
	wait.Until(t, 2*time.Minute, "the killed member back in the group", func() error {
		_ = alive()
		s, err := demoGroupStatus(base)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(s.Members, func(m group.MemberStatus) bool { return m.ID == victim }) {
			return fmt.Errorf("members %+v", s.Members)
		}
		return nil
	})
	time.Sleep(3 * time.Second)

	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Fatalf("the demo failed: %v\n%s", err, tail(p.out.String(), 6000))
		}
	case <-time.After(5 * time.Minute):
		t.Fatalf("the demo did not stop within 5 minutes of SIGINT:\n%s", tail(p.out.String(), 6000))
	}
	out := p.out.String()
	if !strings.Contains(out, "verified: ") {
		t.Fatalf("no verification in the demo's output:\n%s", tail(out, 6000))
	}
	t.Logf("%s", tail(out, 1500))
}

// demoGroupStatus is the group demo's /api/group.
func demoGroupStatus(base string) (group.Status, error) {
	var st group.Status
	resp, err := http.Get(base + "/api/group")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return st, fmt.Errorf("/api/group: %s: %s", resp.Status, b)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// demoSubName is the name the group's events give the word count's
// sub-topology k.
func demoSubName(k int) string {
	if k == 0 {
		return "wordcount"
	}
	return fmt.Sprintf("wordcount.s%d", k)
}
