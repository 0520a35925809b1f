package runtime

import (
	"testing"

	"cairn/internal/app/job"
	"cairn/wasm"
)

// TestPlanMemory: the budget's division over a graph's slots and
// instances, the floors, the embedded server's share, and the stage's
// own memory limit kept when it is the smaller.
func TestPlanMemory(t *testing.T) {
	parse := func(y string) *job.Job {
		t.Helper()
		j, err := job.Parse([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	j := parse(`name: g
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: split, module: "builtin:split"}
  - {name: count, module: "builtin:count", keyed: true}
  - {name: all, module: "builtin:rekey"}
  - {name: top, module: "builtin:top_n", keyed: true, slots: 1}
output: {stream: OUT, subject: out}
slots: 2
memory: 512MiB
`)
	b, err := planMemory(j, j.Graph())
	if err != nil {
		t.Fatal(err)
	}
	// Sub-topology 0: split (1 instance) + count (2 slots); 1: all (1) +
	// top (1 slot). 3 slots, 5 instances.
	if b.Slots != 3 || b.Instances != 5 {
		t.Fatalf("slots %d instances %d, want 3 and 5", b.Slots, b.Instances)
	}
	const total = 512 << 20
	if b.Total != total || b.NATS != total*15/100 || b.SlotCache != (total/4)/3 || b.SlotMemTable != (total/10)/6 {
		t.Errorf("division: %+v", b)
	}
	if b.InstanceBytes != max((total*30/100)/5, minInstanceBytes) {
		t.Errorf("instance limit %d", b.InstanceBytes)
	}
	if p := b.instancePages(0); p != uint32(b.InstanceBytes>>16) {
		t.Errorf("pages %d, want the budget's share %d", p, b.InstanceBytes>>16)
	}
	if p := b.instancePages(100); p != 100 {
		t.Errorf("a stage's smaller limit (100 pages) became %d", p)
	}
	if got := len(b.shares()); got != 6 {
		t.Errorf("%d shares in /metrics", got)
	}

	// An external server: its share goes to the block caches; a small
	// budget keeps the floors.
	j.NATS, j.Memory = "nats://127.0.0.1:4222", "64MiB"
	small := float64(64 << 20)
	externalCache := int64(small*shareCache) + int64(small*shareNATS)
	b, _ = planMemory(j, j.Graph())
	if b.NATS != 0 || b.SlotCache != max(externalCache/3, minSlotCache) || b.InstanceBytes != minInstanceBytes {
		t.Errorf("external server, 64 MiB: %+v", b)
	}
	// No budget: nothing changes.
	j.Memory = ""
	b, _ = planMemory(j, j.Graph())
	if b.Total != 0 || b.instancePages(0) != wasm.DefaultMemoryPages || b.shares() != nil {
		t.Errorf("no budget: %+v", b)
	}
	if c, m := b.stateOptions(); c != 0 || m != 0 {
		t.Errorf("no budget: state options %d %d", c, m)
	}
	// Too small a budget is refused with the field.
	if _, err := job.Parse([]byte("name: g\ninput: {stream: IN, subjects: [a]}\nstages: [{name: s, module: m}]\noutput: {stream: O, subject: o}\nmemory: 10MiB\n")); err == nil {
		t.Error("memory: 10MiB accepted")
	}
}
