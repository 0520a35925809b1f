package job

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// A job graph: named inputs, stages that name what they read (`from:`),
// cut into sub-topologies (docs/JOBS.md, "Topology"; shared/DESIGN.md,
// "Job graphs").
//
// A sub-topology is the engine's unit: one source (a job input, or a
// repartition stream), stateless stages, at most one keyed stage, and one
// output (the job's, or a repartition stream read by the next). The job is
// cut
//
//   - after every keyed stage that another stage reads (the key changes);
//   - before every stage that reads two inputs (a join, a union): each side
//     ends its own sub-topology, and both write into the one repartition
//     stream the two-input stage reads, each on subjects of its own, so the
//     stream fixes the interleaving of the sides and every key group
//     subject keeps one writer;
//   - where an input is read by several stages: each starts a sub-topology
//     of its own on the input stream.
//
// Sub-topologies are numbered in topological order; a chain keeps the
// numbering it always had (k reads repartition stream k, written by k-1).

// MaxSides is the number of inputs a stage may read.
const MaxSides = 2

// SubTopology is one part of a job graph.
type SubTopology struct {
	// Index is k: the sub-topology's number (0 for the first).
	Index int
	// Stages run in order; the first may read two sides (Sides == 2).
	// Empty for a side that only forwards its input into a two-input
	// stage's stream.
	Stages []Stage
	// Input names the job input the sub-topology reads; "" when it reads
	// repartition stream Index.
	Input string
	// Sides is the number of writers of the repartition stream it reads
	// (2 when its first stage reads two inputs; 1 otherwise; 0 when it
	// reads a job input).
	Sides int
	// Feeds is the sub-topology whose repartition stream this one writes
	// (-1: it writes the job's output), on subjects of side Side.
	Feeds, Side int
}

// Keyed reports whether the sub-topology has a keyed stage (its last
// keyed stage is its only one).
func (s *SubTopology) Keyed() (Stage, bool) {
	for _, st := range s.Stages {
		if st.Keyed {
			return st, true
		}
	}
	return Stage{}, false
}

// InputsOf returns the job's inputs: `inputs:`, or `input:` named "input".
func (j *Job) InputsOf() []Input {
	if len(j.Inputs) > 0 {
		return j.Inputs
	}
	in := j.Input
	if in.Name == "" {
		in.Name = DefaultInputName
	}
	return []Input{in}
}

// DefaultInputName names the input of a job file with `input:`.
const DefaultInputName = "input"

// InputNamed returns the job input called name.
func (j *Job) InputNamed(name string) (Input, bool) {
	for _, in := range j.InputsOf() {
		if in.Name == name {
			return in, true
		}
	}
	return Input{}, false
}

// fromOf is what stage i reads: its `from:`, or the stage before it (the
// only input, for the first stage).
func (j *Job) fromOf(i int) []string {
	if len(j.Stages[i].From) > 0 {
		return j.Stages[i].From
	}
	if i == 0 {
		ins := j.InputsOf()
		if len(ins) == 1 {
			return []string{ins[0].Name}
		}
		return nil
	}
	return []string{j.Stages[i-1].Name}
}

// validateGraph checks the graph the stages' `from:` lists make: every
// name known, no cycle, every input and stage read by something, one
// stage (the last one nobody reads) feeding the job's output.
func (j *Job) validateGraph() error {
	bad := func(field, format string, a ...any) error {
		return &Error{Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	stageIdx := map[string]int{}
	for i, s := range j.Stages {
		stageIdx[s.Name] = i
	}
	inputs := map[string]bool{}
	for _, in := range j.InputsOf() {
		inputs[in.Name] = true
	}
	readers := map[string][]int{} // stage or input name -> the stages reading it
	for i := range j.Stages {
		f := fmt.Sprintf("stages[%d].from", i)
		from := j.fromOf(i)
		if len(from) == 0 {
			return bad(f, "required: the job has %d inputs (%s), so the first stage must name the one it reads", len(inputs), strings.Join(j.inputNames(), ", "))
		}
		if len(from) > MaxSides {
			return bad(f, "stage %q reads %d inputs; a stage reads at most %d (chain unions for more)", j.Stages[i].Name, len(from), MaxSides)
		}
		for n, name := range from {
			_, isStage := stageIdx[name]
			switch {
			case name == j.Stages[i].Name:
				return bad(fmt.Sprintf("%s[%d]", f, n), "stage %q reads itself: a job graph has no cycles", name)
			case inputs[name] && isStage:
				return bad(fmt.Sprintf("%s[%d]", f, n), "%q names both an input and a stage; rename one", name)
			case !inputs[name] && !isStage:
				return bad(fmt.Sprintf("%s[%d]", f, n), "%q is neither an input (%s) nor a stage", name, strings.Join(j.inputNames(), ", "))
			}
			if slices.Contains(from[:n], name) {
				return bad(fmt.Sprintf("%s[%d]", f, n), "stage %q reads %q twice", j.Stages[i].Name, name)
			}
			readers[name] = append(readers[name], i)
		}
		if len(from) == MaxSides && len(j.Stages[i].From) == 0 {
			return bad(f, "internal: two inputs without from") // unreachable: fromOf gives one
		}
	}
	// Cycles: a depth-first walk over "reads" edges.
	const (
		unseen = iota
		walking
		done
	)
	mark := make([]int, len(j.Stages))
	var walk func(i int, path []string) error
	walk = func(i int, path []string) error {
		switch mark[i] {
		case walking:
			cycle := append(path[slices.Index(path, j.Stages[i].Name):], j.Stages[i].Name)
			return bad(fmt.Sprintf("stages[%d].from", i), "the stages form a cycle (%s): a job graph is acyclic", strings.Join(cycle, " <- "))
		case done:
			return nil
		}
		mark[i] = walking
		for _, name := range j.fromOf(i) {
			if k, ok := stageIdx[name]; ok {
				if err := walk(k, append(path, j.Stages[i].Name)); err != nil {
					return err
				}
			}
		}
		mark[i] = done
		return nil
	}
	for i := range j.Stages {
		if err := walk(i, nil); err != nil {
			return err
		}
	}
	for _, name := range j.inputNames() {
		if len(readers[name]) == 0 {
			return bad("inputs", "input %q is read by no stage (name it in a stage's from)", name)
		}
	}
	var sinks []string
	for i, s := range j.Stages {
		switch r := readers[s.Name]; {
		case len(r) == 0:
			sinks = append(sinks, s.Name)
		case len(r) > 1:
			return bad(fmt.Sprintf("stages[%d]", r[1]), "stage %q is read by both %q and %q: a stage's output goes to one place (read the input in each branch instead)",
				s.Name, j.Stages[r[0]].Name, j.Stages[r[1]].Name)
		}
		_ = i
	}
	for _, in := range j.InputsOf() {
		if in.Table == "" {
			continue
		}
		for _, i := range readers[in.Name] {
			if from := j.fromOf(i); len(from) != MaxSides || from[1] != in.Name {
				return bad(fmt.Sprintf("stages[%d].from", i), "table %q is read by stage %q otherwise than as the second of two inputs: a table joins a stream (from: [stream, %s], e.g. builtin:lookup_join)", in.Name, j.Stages[i].Name, in.Name)
			}
		}
	}
	if len(sinks) > 1 {
		return bad("stages", "stages %s are read by no stage; one stage, the last of the graph, feeds the output", strings.Join(quoteAll(sinks), ", "))
	}
	return nil
}

func (j *Job) inputNames() []string {
	var n []string
	for _, in := range j.InputsOf() {
		n = append(n, in.Name)
	}
	return n
}

func quoteAll(s []string) []string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return q
}

// Graph cuts a valid job into its sub-topologies, in topological order.
func (j *Job) Graph() []SubTopology {
	stageIdx := map[string]int{}
	for i, s := range j.Stages {
		stageIdx[s.Name] = i
	}
	reader := map[string]int{} // stage name -> the stage reading it
	for i := range j.Stages {
		for _, name := range j.fromOf(i) {
			if _, ok := stageIdx[name]; ok {
				reader[name] = i
			}
		}
	}
	// A stage starts a sub-topology when it reads two inputs, reads a job
	// input, or reads a keyed stage.
	starts := func(i int) bool {
		from := j.fromOf(i)
		if len(from) > 1 {
			return true
		}
		k, ok := stageIdx[from[0]]
		return !ok || j.Stages[k].Keyed
	}
	type part struct {
		stages []int
		input  string // a job input read directly
		sides  []int  // the parts writing this one's stream, in from order
		feeds  int    // part index of the reader (-1: the output)
		side   int
		order  int // sort key: the first stage's file index (sides: their reader's)
	}
	var parts []*part
	partOf := map[int]int{} // stage index -> part
	for i := range j.Stages {
		if !starts(i) {
			continue
		}
		p := &part{feeds: -1, order: 2 * i}
		for k := i; ; {
			p.stages = append(p.stages, k)
			partOf[k] = len(parts)
			next, ok := reader[j.Stages[k].Name]
			if !ok || starts(next) {
				break
			}
			k = next
		}
		if from := j.fromOf(i); len(from) == 1 {
			if _, ok := stageIdx[from[0]]; !ok {
				p.input = from[0]
			}
		}
		parts = append(parts, p)
	}
	// Two-input stages: a side that is a job input gets a part of its own
	// that only forwards it; a side that is a stage is its part's end.
	for pi := range parts {
		p := parts[pi]
		from := j.fromOf(p.stages[0])
		if len(from) < MaxSides {
			continue
		}
		for side, name := range from {
			if _, ok := stageIdx[name]; ok {
				continue
			}
			parts = append(parts, &part{input: name, feeds: pi, side: side, order: 2*p.stages[0] - 1})
			p.sides = append(p.sides, len(parts)-1)
		}
	}
	for pi, p := range parts {
		if len(p.stages) == 0 {
			continue
		}
		first := p.stages[0]
		from := j.fromOf(first)
		for side, name := range from {
			k, ok := stageIdx[name]
			if !ok {
				continue
			}
			up := parts[partOf[k]]
			up.feeds = pi
			if len(from) > 1 {
				up.side = side
				p.sides = append(p.sides, partOf[k])
			}
		}
	}
	// Topological order, the lowest sort key first among the ready parts:
	// a chain keeps its order, a side comes just before what it feeds.
	indeg := make([]int, len(parts))
	for _, p := range parts {
		if p.feeds >= 0 {
			indeg[p.feeds]++
		}
	}
	var order []int
	done := make([]bool, len(parts))
	for len(order) < len(parts) {
		best := -1
		for pi, p := range parts {
			if !done[pi] && indeg[pi] == 0 && (best < 0 || p.order < parts[best].order) {
				best = pi
			}
		}
		done[best] = true
		order = append(order, best)
		if f := parts[best].feeds; f >= 0 {
			indeg[f]--
		}
	}
	index := make([]int, len(parts))
	for k, pi := range order {
		index[pi] = k
	}
	subs := make([]SubTopology, len(parts))
	for k, pi := range order {
		p := parts[pi]
		s := SubTopology{Index: k, Input: p.input, Feeds: -1, Side: p.side}
		for _, i := range p.stages {
			s.Stages = append(s.Stages, j.Stages[i])
		}
		if p.feeds >= 0 {
			s.Feeds = index[p.feeds]
		}
		if p.input == "" {
			s.Sides = max(len(p.sides), 1)
		}
		subs[k] = s
	}
	// Sides in from order (already), sub-topology indices fixed up above.
	slices.SortStableFunc(subs, func(a, b SubTopology) int { return cmp.Compare(a.Index, b.Index) })
	return subs
}
