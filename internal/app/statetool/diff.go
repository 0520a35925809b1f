package statetool

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"cairn/checkpoint"
	"cairn/internal/base/procs"
	"cairn/state"
)

// StageDiff compares one stage's state in two checkpoints.
type StageDiff struct {
	Stage string
	// Entries and Bytes (stored keys and values) in A and in B.
	EntriesA, EntriesB int64
	BytesA, BytesB     int64
	// OnlyA and OnlyB count the entries whose key only one of them has;
	// Changed those both have with different values.
	OnlyA, OnlyB, Changed int64
	// Examples of user keys only in A, only in B, changed (up to
	// DiffExamples each, in key-group order).
	ExamplesA, ExamplesB, ExamplesChanged []string
}

// DiffExamples bounds the example keys a StageDiff lists.
const DiffExamples = 5

// Diff compares the state of two checkpoints or savepoints of the same key
// groups, entry by entry, key group by key group, and returns a summary per
// stage (sorted by stage name).
func Diff(ctx context.Context, store checkpoint.Store, a, b *checkpoint.Manifest, stages Stages, tempDir string) ([]StageDiff, error) {
	if a.KeyGroups != b.KeyGroups {
		return nil, fmt.Errorf("statetool: diff: key_groups %d and %d: state of different key-group counts is not comparable entry by entry (export both and compare the files)", a.KeyGroups, b.KeyGroups)
	}
	if stages == nil {
		stages = DefaultStages()
	}
	ra, err := openReader(ctx, store, a, tempDir)
	if err != nil {
		return nil, fmt.Errorf("statetool: diff: %w", err)
	}
	defer ra.Close()
	rb, err := openReader(ctx, store, b, tempDir)
	if err != nil {
		return nil, fmt.Errorf("statetool: diff: %w", err)
	}
	defer rb.Close()
	total := map[uint8]*StageDiff{}

	read := func(ctx context.Context, r *reader, kg int) ([]record, error) {
		var out []record
		err := r.keyGroup(ctx, kg, func(k, v []byte) error {
			out = append(out, record{k: bytes.Clone(k), v: bytes.Clone(v)})
			return nil
		})
		return out, err
	}
	err = ordered(ctx, a.KeyGroups, procs.CPUs(), func(ctx context.Context, kg int) (map[uint8]*StageDiff, error) {
		x, err := read(ctx, ra, kg)
		if err != nil {
			return nil, err
		}
		y, err := read(ctx, rb, kg)
		if err != nil {
			return nil, err
		}
		d := map[uint8]*StageDiff{}
		get := func(k []byte) *StageDiff {
			s := d[k[2]]
			if s == nil {
				s = &StageDiff{Stage: stages.name(k[2])}
				d[k[2]] = s
			}
			return s
		}
		example := func(list *[]string, k []byte) {
			if len(*list) < DiffExamples {
				*list = append(*list, exampleKey(k))
			}
		}
		i, j := 0, 0
		for i < len(x) || j < len(y) {
			c := 0
			switch {
			case i == len(x):
				c = 1
			case j == len(y):
				c = -1
			default:
				c = bytes.Compare(x[i].k, y[j].k)
			}
			switch {
			case c < 0:
				s := get(x[i].k)
				s.EntriesA++
				s.BytesA += int64(len(x[i].k) + len(x[i].v))
				s.OnlyA++
				example(&s.ExamplesA, x[i].k)
				i++
			case c > 0:
				s := get(y[j].k)
				s.EntriesB++
				s.BytesB += int64(len(y[j].k) + len(y[j].v))
				s.OnlyB++
				example(&s.ExamplesB, y[j].k)
				j++
			default:
				s := get(x[i].k)
				s.EntriesA++
				s.EntriesB++
				s.BytesA += int64(len(x[i].k) + len(x[i].v))
				s.BytesB += int64(len(y[j].k) + len(y[j].v))
				if !bytes.Equal(x[i].v, y[j].v) {
					s.Changed++
					example(&s.ExamplesChanged, x[i].k)
				}
				i++
				j++
			}
		}
		return d, nil
	}, func(kg int, d map[uint8]*StageDiff) error {
		for id, s := range d {
			t := total[id]
			if t == nil {
				total[id] = s
				continue
			}
			t.EntriesA += s.EntriesA
			t.EntriesB += s.EntriesB
			t.BytesA += s.BytesA
			t.BytesB += s.BytesB
			t.OnlyA += s.OnlyA
			t.OnlyB += s.OnlyB
			t.Changed += s.Changed
			for _, p := range []struct{ to, from *[]string }{{&t.ExamplesA, &s.ExamplesA}, {&t.ExamplesB, &s.ExamplesB}, {&t.ExamplesChanged, &s.ExamplesChanged}} {
				for _, e := range *p.from {
					if len(*p.to) < DiffExamples {
						*p.to = append(*p.to, e)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("statetool: diff: %w", err)
	}
	var out []StageDiff
	for _, s := range total {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(p, q StageDiff) int {
		switch {
		case p.Stage < q.Stage:
			return -1
		case p.Stage > q.Stage:
			return 1
		}
		return 0
	})
	return out, nil
}

// exampleKey names an entry for people: its kind, user key and sub-key.
func exampleKey(k []byte) string {
	e, err := state.DecodeKey(k)
	if err != nil {
		return fmt.Sprintf("%x", k)
	}
	switch e.Kind {
	case state.KindValue:
		if len(e.Sub) > 0 {
			return fmt.Sprintf("%q/%q", e.UserKey, e.Sub)
		}
		return fmt.Sprintf("%q", e.UserKey)
	case state.KindTimer:
		return fmt.Sprintf("timer %q@%d", e.UserKey, e.Time)
	}
	return fmt.Sprintf("counter %d of key group %d", e.Counter, e.KeyGroup)
}

// PrintDiff writes a Diff for people.
func PrintDiff(w io.Writer, a, b string, ds []StageDiff) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "stage\tentries A\tentries B\tbytes A\tbytes B\tonly in A\tonly in B\tchanged\t\n")
	same := true
	for _, d := range ds {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", d.Stage, d.EntriesA, d.EntriesB, d.BytesA, d.BytesB, d.OnlyA, d.OnlyB, d.Changed)
		same = same && d.OnlyA == 0 && d.OnlyB == 0 && d.Changed == 0
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, d := range ds {
		for _, l := range []struct {
			what string
			keys []string
		}{{"only in " + a, d.ExamplesA}, {"only in " + b, d.ExamplesB}, {"changed", d.ExamplesChanged}} {
			if len(l.keys) > 0 {
				fmt.Fprintf(w, "%s %s: %v\n", d.Stage, l.what, l.keys)
			}
		}
	}
	if same {
		fmt.Fprintf(w, "A (%s) and B (%s) hold the same state\n", a, b)
	}
	return nil
}
