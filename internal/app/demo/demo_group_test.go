package demo

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
)

// TestGroupJobYAML: the group demo's job is a valid group job whose graph
// cuts into groupSubTopologies sub-topologies (one per member of three),
// and its last stage is the one-chain demo's count onto the same output,
// which the verifier checks.
func TestGroupJobYAML(t *testing.T) {
	j, err := job.Parse([]byte(groupJobYAML("nats://127.0.0.1:1,nats://127.0.0.1:2", "file:///tmp/store", 2)))
	if err != nil {
		t.Fatal(err)
	}
	if j.Group == nil || j.Group.LeaseTTL != groupLeaseTTL || j.Group.Replicas != groupNodes {
		t.Fatalf("group section %+v", j.Group)
	}
	plan, err := runtime.NewPlan(j)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Subs) != groupSubTopologies {
		t.Fatalf("%d sub-topologies, want %d", len(plan.Subs), groupSubTopologies)
	}
	last := j.Stages[len(j.Stages)-1]
	if last.Module != "builtin:count" || !last.Keyed || j.Output.Stream != demoOutputStream || j.Output.Subject != demoOutputSubject || j.KeyGroups != demoKeyGroups {
		t.Fatalf("last stage %+v, output %+v, key groups %d: not the demo's count", last, j.Output, j.KeyGroups)
	}
}

// TestGroupDemoRefusals: fewer than two members, and a data directory of
// the one-process demo, are refused before anything starts; so is the
// one-process demo on a group demo's directory.
func TestGroupDemoRefusals(t *testing.T) {
	ctx := context.Background()
	var out strings.Builder
	err := runGroupDemo(ctx, demoConfig{data: t.TempDir(), http: "off"}, 1, &out, &out)
	if !errors.Is(err, ErrGroupDemo) || !strings.Contains(err.Error(), "--members 1") {
		t.Fatalf("one member: %v", err)
	}
	single := t.TempDir()
	if err := saveDemoMemory(single, demoMemory{NATSPort: 4222, Slots: 2}); err != nil {
		t.Fatal(err)
	}
	err = runGroupDemo(ctx, demoConfig{data: single, http: "off"}, 3, &out, &out)
	if !errors.Is(err, ErrGroupDemo) || !strings.Contains(err.Error(), "one-process demo") {
		t.Fatalf("a one-process demo's directory: %v", err)
	}
	grp := t.TempDir()
	if err := os.WriteFile(filepath.Join(grp, groupMarker), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = runDemo(ctx, demoConfig{data: grp, http: "off"}, &out, &out)
	if !errors.Is(err, ErrGroupDemo) || !strings.Contains(err.Error(), "group demo") {
		t.Fatalf("a group demo's directory: %v", err)
	}
}
