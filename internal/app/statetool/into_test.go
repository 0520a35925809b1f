package statetool

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"

	"cairn/checkpoint"
)

// TestMigrateInto: a keyed stage split in two. The state of the keyed
// stage of sub-topology "job" is copied into stage tally of sub-topology
// "job.s1" — once as it is, once through a migration — as a savepoint of
// job.s1 that holds that state only (no engine state), resumes at the
// start of the sub-topology's stream, records the state version, and
// restores onto 3 slots with exactly the model's entries; the savepoint
// read is untouched. A copy into the sub-topology read, with another
// key-group count, or with a rename is refused.
func TestMigrateInto(t *testing.T) {
	ctx := context.Background()
	store, dir := newStore(t)
	orig := writeSavepoint(t, store, dir, "job", "v1", 64, 2, 4000, mixedState, true)
	before := entriesOf(t, store, orig)
	keyedOnly := func(in []kv) []kv {
		var out []kv
		for _, x := range in {
			if x.k[2] == keyedStage {
				out = append(out, x)
			}
		}
		return out
	}
	into := &Into{Job: "job.s1", Stage: "tally", SourceStream: "CAIRN_RP_JOB_1", KeyGroups: 64}
	stages := Stages{"count": 1}

	// As it is.
	m, st, err := Migrate(ctx, MigrateOptions{Store: store, From: orig, FromSpec: "savepoint:v1", Job: "job", To: "split", Stages: stages, Into: into, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	want := keyedOnly(before)
	if len(want) == 0 || len(want) == len(before) {
		t.Fatalf("fixture: %d keyed entries of %d", len(want), len(before))
	}
	sameEntries(t, "copy", entriesOf(t, store, m), want)
	loaded, err := checkpoint.LoadSavepoint(ctx, store, "job.s1", "split")
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, "copy restored onto 3 slots", restoredEntries(t, store, loaded, "job.s1", 3), want)
	if loaded.Job != "job.s1" || loaded.SourceStream != "CAIRN_RP_JOB_1" || loaded.SourceSeq != 0 || len(loaded.Modules) != 0 || len(loaded.StateVersions) != 0 ||
		loaded.Origin == nil || !strings.Contains(strings.Join(loaded.Origin.Steps, "; "), "copy the state of the keyed stage of job into stage tally of job.s1") ||
		st.Read.Entries != int64(len(before)) || st.Written.Entries != int64(len(want)) {
		t.Fatalf("manifest %+v origin %+v stats %+v", loaded, loaded.Origin, st)
	}

	// Through a migration, from a savepoint whose stage has a state version.
	mod := buildModule(t, "testdata/testmig")
	m, st, err = Migrate(ctx, MigrateOptions{Store: store, From: orig, FromSpec: "savepoint:v1", Job: "job", To: "split-migrated", Stages: stages, Into: into,
		Module: mod, ModuleName: "testmig.wasm", Config: []byte(`{"first_seen": 777, "extend_ms": 1000}`), Runtime: runtimeForTests(t), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	want = keyedOnly(testmigModel(t, before, "777", "1000"))
	sameEntries(t, "migrated copy", entriesOf(t, store, m), want)
	if loaded, err = checkpoint.LoadSavepoint(ctx, store, "job.s1", "split-migrated"); err != nil {
		t.Fatal(err)
	}
	sameEntries(t, "migrated copy restored onto 3 slots", restoredEntries(t, store, loaded, "job.s1", 3), want)
	if loaded.StateVersions["tally"] != 3 || len(loaded.StateVersions) != 1 || st.StateVersion != 3 || st.Migrated == 0 {
		t.Fatalf("versions %v stats %+v", loaded.StateVersions, st)
	}
	// Its version follows a plain copy of it on.
	m, st, err = Migrate(ctx, MigrateOptions{Store: store, From: loaded, FromSpec: "savepoint:split-migrated", Job: "job.s1", To: "again", Into: &Into{Job: "job.s2", Stage: "third"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if m.StateVersions["third"] != 3 || st.StateVersion != 3 {
		t.Fatalf("a copy of version-3 state: versions %v", m.StateVersions)
	}
	sameEntries(t, "copy of the copy", entriesOf(t, store, m), want)

	// The output moves along: the output counts go with the copy, and the
	// read sub-topology's own new savepoint drops them.
	var counts, rest []kv
	for _, x := range before {
		switch {
		case x.k[2] != keyedStage && isOutputCount([]byte(x.k)):
			counts = append(counts, x)
		case x.k[2] != keyedStage:
			rest = append(rest, x)
		}
	}
	if len(counts) == 0 || len(rest) == 0 {
		t.Fatalf("fixture: %d output counts, %d other engine entries", len(counts), len(rest))
	}
	moved := &Into{Job: "job.s1", Stage: "tally", SourceStream: "CAIRN_RP_JOB_1", MoveOutputs: true}
	if m, _, err = Migrate(ctx, MigrateOptions{Store: store, From: orig, FromSpec: "savepoint:v1", Job: "job", To: "moved", Stages: stages, Into: moved, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	wantMoved := append(keyedOnly(before), counts...)
	sort.Slice(wantMoved, func(i, j int) bool { return wantMoved[i].k < wantMoved[j].k })
	sameEntries(t, "copy with the output counts", entriesOf(t, store, m), wantMoved)
	if m, _, err = Migrate(ctx, MigrateOptions{Store: store, From: orig, FromSpec: "savepoint:v1", Job: "job", To: "reset", Stages: stages, ResetOutputs: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	wantReset := append(keyedOnly(before), rest...)
	sort.Slice(wantReset, func(i, j int) bool { return wantReset[i].k < wantReset[j].k })
	sameEntries(t, "the read sub-topology without its output counts", entriesOf(t, store, m), wantReset)
	if m.Origin == nil || m.Origin.NewInput || !strings.Contains(strings.Join(m.Origin.Steps, "; "), "reset the output counts") {
		t.Fatalf("reset: origin %+v", m.Origin)
	}
	if !loaded.Origin.NewInput {
		t.Fatal("the copy does not record that it starts a new input")
	}

	// The savepoint read is as it was.
	sameEntries(t, "the savepoint read", entriesOf(t, store, orig), before)

	for _, c := range []struct {
		name string
		o    MigrateOptions
		want string
	}{
		{"same sub-topology", MigrateOptions{Into: &Into{Job: "job", Stage: "count"}}, "the one read"},
		{"key groups", MigrateOptions{Into: &Into{Job: "job.s1", Stage: "tally", KeyGroups: 128}}, "64 key groups, the job 128"},
		{"rename", MigrateOptions{Into: into, Rename: map[string]string{"count": "c"}}, "run them separately"},
	} {
		o := c.o
		o.Store, o.From, o.FromSpec, o.Job, o.To, o.Stages, o.Logger = store, orig, "savepoint:v1", "job", "refused", stages, quiet
		if _, _, err := Migrate(ctx, o); !errors.Is(err, ErrInto) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
}
