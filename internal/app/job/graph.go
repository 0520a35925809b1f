package job

import (
	"fmt"
	"slices"
	"strings"
)

// A job graph: named inputs, stages that name what they read (`from:`),
// stages with named output ports (`ports:`), named outputs (`outputs:`),
// cut into sub-topologies (docs/JOBS.md, "Topology"; docs/DESIGN.md,
// "Job graphs").
//
// A sub-topology is the engine's unit: one source (a job input, or a
// repartition stream), stateless stages, at most one keyed stage, and the
// targets of its last stage's ports (job outputs, and repartition streams
// read by other sub-topologies). The job is cut
//
//   - after every keyed stage that another stage reads (the key changes);
//   - before every stage that reads two inputs (a join, a union): each side
//     ends its own sub-topology, and both write into the one repartition
//     stream the two-input stage reads, each on subjects of its own, so the
//     stream fixes the interleaving of the sides and every key group
//     subject keeps one writer;
//   - after every stage whose output goes to more than one place (several
//     readers, named ports, named outputs): each place is a target of its
//     own, with its own exactly-once indexes;
//   - where an input is read by several stages: each starts a sub-topology
//     of its own on the input stream.
//
// Sub-topologies are numbered in topological order; a chain keeps the
// numbering it always had (k reads repartition stream k, written by k-1).

// MaxSides is the number of inputs a stage may read.
const MaxSides = 2

// MaxPorts is the number of output ports a stage may have.
const MaxPorts = 64

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
	// Targets are where the last stage's ports go, by port, then in the
	// order of the job file; Targets[0] (port 0's first) is the primary.
	Targets []Target
}

// Target is one place a sub-topology's outputs go.
type Target struct {
	// Port is the output port of the sub-topology's last stage.
	Port int
	// Feeds is the sub-topology whose repartition stream the target is,
	// written as side Side; -1 for a job output.
	Feeds, Side int
	// Output names the job output when Feeds is -1 ("": `output:`).
	Output string
}

// Keyed returns the sub-topology's keyed stage, if it has one.
func (s *SubTopology) Keyed() (Stage, bool) {
	for _, st := range s.Stages {
		if st.Keyed {
			return st, true
		}
	}
	return Stage{}, false
}

// Repartitions reports whether the sub-topology writes a repartition
// stream.
func (s *SubTopology) Repartitions() bool {
	for _, t := range s.Targets {
		if t.Feeds >= 0 {
			return true
		}
	}
	return false
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

// OutputNamed returns the job output called name ("": `output:`).
func (j *Job) OutputNamed(name string) (NamedOutput, bool) {
	if name == "" {
		return NamedOutput{Stream: j.Output.Stream, Subject: j.Output.Subject}, j.Output.Subject != ""
	}
	for _, o := range j.Outputs {
		if o.Name == name {
			return o, true
		}
	}
	return NamedOutput{}, false
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

// ref is a resolved name of a `from:`: an input, or a stage's port.
type ref struct {
	input string // a job input ("" for a stage)
	stage int    // the stage's index (input == "")
	port  int
}

// consumer is one reader of a stage's port: a stage (as side Side of its
// inputs) or a job output.
type consumer struct {
	stage, side int    // stage -1: a job output
	output      string // the job output's name ("": `output:`)
}

// graph is the resolved graph of a valid job.
type graph struct {
	from      [][]ref          // per stage
	consumers [][][]consumer   // per stage, per port
	stageIdx  map[string]int   // stage name -> index
	inputs    map[string]bool  // input names
	tables    map[string]bool  // input names that are tables
	inReaders map[string][]int // input name -> the stages reading it
	portIdx   []map[string]int // per stage: port name -> index
	outputs   map[string]bool  // named outputs
	defaultTo int              // the stage `output:` reads (-1: none)
}

// ports returns stage i's number of output ports (1 without `ports:`).
func (j *Job) ports(i int) int { return max(len(j.Stages[i].Ports), 1) }

// resolve resolves a name of `from:` (an input, a stage, or stage.port).
func (j *Job) resolve(g *graph, name string) (ref, error) {
	node, port, hasPort := strings.Cut(name, ".")
	if g.inputs[node] {
		if hasPort {
			return ref{}, fmt.Errorf("%q: input %q has no ports", name, node)
		}
		if _, isStage := g.stageIdx[node]; isStage {
			return ref{}, fmt.Errorf("%q names both an input and a stage; rename one", node)
		}
		return ref{input: node}, nil
	}
	k, ok := g.stageIdx[node]
	if !ok {
		return ref{}, fmt.Errorf("%q is neither an input (%s) nor a stage", node, strings.Join(j.inputNames(), ", "))
	}
	st := j.Stages[k]
	if !hasPort {
		if len(st.Ports) > 0 {
			return ref{}, fmt.Errorf("stage %q has ports (%s): name one, like %s.%s", node, strings.Join(st.Ports, ", "), node, st.Ports[0])
		}
		return ref{stage: k}, nil
	}
	p, ok := g.portIdx[k][port]
	if !ok {
		if len(st.Ports) == 0 {
			return ref{}, fmt.Errorf("%q: stage %q has no ports (declare them with ports:)", name, node)
		}
		return ref{}, fmt.Errorf("%q: stage %q has no port %q (it has %s)", name, node, port, strings.Join(st.Ports, ", "))
	}
	return ref{stage: k, port: p}, nil
}

// validateGraph checks the graph the stages' `from:`, `ports:` and the
// job's outputs make, and resolves it: every name known, no cycle, every
// input and port read by something, `output:` fed by exactly the one
// stage left unread.
func (j *Job) validateGraph() (*graph, error) {
	bad := func(field, format string, a ...any) error {
		return &Error{Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	g := &graph{stageIdx: map[string]int{}, inputs: map[string]bool{}, tables: map[string]bool{}, inReaders: map[string][]int{},
		outputs: map[string]bool{}, defaultTo: -1}
	for i, s := range j.Stages {
		g.stageIdx[s.Name] = i
		pi := map[string]int{}
		if len(s.Ports) > MaxPorts {
			return nil, bad(fmt.Sprintf("stages[%d].ports", i), "%d ports; a stage has at most %d", len(s.Ports), MaxPorts)
		}
		for p, name := range s.Ports {
			if !nameRe.MatchString(name) {
				return nil, bad(fmt.Sprintf("stages[%d].ports[%d]", i, p), "%q must be 1-64 letters, digits, '-' or '_'", name)
			}
			if _, dup := pi[name]; dup {
				return nil, bad(fmt.Sprintf("stages[%d].ports[%d]", i, p), "duplicate port %q", name)
			}
			pi[name] = p
		}
		g.portIdx = append(g.portIdx, pi)
		g.consumers = append(g.consumers, make([][]consumer, j.ports(i)))
	}
	for _, in := range j.InputsOf() {
		g.inputs[in.Name] = true
		if in.Table != "" {
			g.tables[in.Name] = true
		}
	}
	g.from = make([][]ref, len(j.Stages))
	for i := range j.Stages {
		f := fmt.Sprintf("stages[%d].from", i)
		from := j.fromOf(i)
		if len(from) == 0 {
			return nil, bad(f, "required: the job has %d inputs (%s), so the first stage must name the one it reads", len(g.inputs), strings.Join(j.inputNames(), ", "))
		}
		if len(from) > MaxSides {
			return nil, bad(f, "stage %q reads %d inputs; a stage reads at most %d (chain unions for more)", j.Stages[i].Name, len(from), MaxSides)
		}
		for n, name := range from {
			fn := fmt.Sprintf("%s[%d]", f, n)
			if len(j.Stages[i].From) == 0 {
				fn = f
			}
			if node, _, _ := strings.Cut(name, "."); node == j.Stages[i].Name {
				return nil, bad(fn, "stage %q reads itself: a job graph has no cycles", node)
			}
			r, err := j.resolve(g, name)
			if err != nil {
				return nil, bad(fn, "%v", err)
			}
			if slices.Contains(g.from[i], r) {
				return nil, bad(fn, "stage %q reads %q twice", j.Stages[i].Name, name)
			}
			g.from[i] = append(g.from[i], r)
			if r.input != "" {
				g.inReaders[r.input] = append(g.inReaders[r.input], i)
				continue
			}
			g.consumers[r.stage][r.port] = append(g.consumers[r.stage][r.port], consumer{stage: i, side: n})
		}
	}
	for n, o := range j.Outputs {
		f := fmt.Sprintf("outputs[%d]", n)
		if !nameRe.MatchString(o.Name) {
			return nil, bad(f+".name", "%q must be 1-64 letters, digits, '-' or '_'", o.Name)
		}
		if g.outputs[o.Name] {
			return nil, bad(f+".name", "duplicate output name %q", o.Name)
		}
		g.outputs[o.Name] = true
		if !subjectRe.MatchString(o.Subject) {
			return nil, bad(f+".subject", "%q must be a subject without wildcards (outputs go to <subject>.<key group>)", o.Subject)
		}
		if j.Output.Delivery != "core" && !nameRe.MatchString(o.Stream) {
			return nil, bad(f+".stream", "%q must be a stream name; delivery %s publishes to JetStream", o.Stream, j.Output.Delivery)
		}
		r, err := j.resolve(g, o.From)
		if err != nil {
			return nil, bad(f+".from", "%v", err)
		}
		if r.input != "" {
			return nil, bad(f+".from", "output %q reads input %q: an output is fed by a stage", o.Name, r.input)
		}
		g.consumers[r.stage][r.port] = append(g.consumers[r.stage][r.port], consumer{stage: -1, output: o.Name})
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
		for _, r := range g.from[i] {
			if r.input == "" {
				if err := walk(r.stage, append(path, j.Stages[i].Name)); err != nil {
					return err
				}
			}
		}
		mark[i] = done
		return nil
	}
	for i := range j.Stages {
		if err := walk(i, nil); err != nil {
			return nil, err
		}
	}
	for _, name := range j.inputNames() {
		if len(g.inReaders[name]) == 0 {
			return nil, bad("inputs", "input %q is read by no stage (name it in a stage's from)", name)
		}
	}
	// Unconnected ports; the stage left unread feeds `output:`.
	var sinks []string
	for i, s := range j.Stages {
		for p, cs := range g.consumers[i] {
			if len(cs) > 0 {
				continue
			}
			if len(s.Ports) > 0 {
				return nil, bad(fmt.Sprintf("stages[%d].ports[%d]", i, p), "port %q of stage %q is connected to nothing: read it in a stage's from or an output's (%s.%s)", s.Ports[p], s.Name, s.Name, s.Ports[p])
			}
			sinks = append(sinks, s.Name)
			g.defaultTo = i
		}
	}
	switch {
	case j.Output.Subject == "" && len(j.Outputs) > 0 && len(sinks) > 0:
		return nil, bad("stages", "stages %s are read by nothing: name them in a stage's from or an output's (the job has no output: section)", strings.Join(quoteAll(sinks), ", "))
	case j.Output.Subject != "" && len(sinks) == 0:
		return nil, bad("output", "no stage is left to feed output: every stage is read by a stage or an entry of outputs (drop output:, or leave one stage unread)")
	case len(sinks) > 1:
		return nil, bad("stages", "stages %s are read by no stage; one stage, the last of the graph, feeds the output (or name each in outputs:)", strings.Join(quoteAll(sinks), ", "))
	}
	for name := range g.tables {
		for _, i := range g.inReaders[name] {
			if from := g.from[i]; len(from) != MaxSides || from[1].input != name {
				return nil, bad(fmt.Sprintf("stages[%d].from", i), "table %q is read by stage %q otherwise than as the second of two inputs: a table joins a stream (from: [stream, %s], e.g. builtin:lookup_join)", name, j.Stages[i].Name, name)
			}
		}
	}
	return g, nil
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
	g, err := j.validateGraph()
	if err != nil {
		panic("job: Graph of an invalid job: " + err.Error()) // Parse validated it
	}
	return j.cut(g)
}

// cut cuts the resolved graph g of j into its sub-topologies.
func (j *Job) cut(g *graph) []SubTopology {
	// continues reports whether stage k's only reader, stage next, runs
	// in k's sub-topology: k is stateless, has one port read by one stage
	// and nothing else, and that stage reads nothing else.
	continues := func(k int) (next int, ok bool) {
		cs := g.consumers[k]
		if j.Stages[k].Keyed || len(cs) != 1 || len(cs[0]) != 1 || cs[0][0].stage < 0 {
			return 0, false
		}
		next = cs[0][0].stage
		return next, len(g.from[next]) == 1
	}
	starts := func(i int) bool {
		from := g.from[i]
		if len(from) != 1 || from[0].input != "" {
			return true
		}
		_, ok := continues(from[0].stage)
		return !ok
	}
	type part struct {
		stages  []int
		input   string // a job input read directly
		sides   int
		targets []Target // Feeds holds part indexes until renumbered
		order   int      // sort key: the first stage's file index (forwarders: their reader's)
	}
	var parts []*part
	partOf := map[int]int{} // stage index -> part
	for i := range j.Stages {
		if !starts(i) {
			continue
		}
		p := &part{order: 2 * i, sides: 1}
		for k := i; ; {
			p.stages = append(p.stages, k)
			partOf[k] = len(parts)
			next, ok := continues(k)
			if !ok {
				break
			}
			k = next
		}
		switch from := g.from[i]; {
		case len(from) == MaxSides:
			p.sides = MaxSides
		case from[0].input != "":
			p.input, p.sides = from[0].input, 0
		}
		parts = append(parts, p)
	}
	// A side of a two-input stage that is a job input gets a part of its
	// own that only forwards it.
	for pi := range parts {
		first := parts[pi].stages[0]
		if len(g.from[first]) < MaxSides {
			continue
		}
		for side, r := range g.from[first] {
			if r.input != "" {
				parts = append(parts, &part{input: r.input, targets: []Target{{Feeds: pi, Side: side}}, order: 2*first - 1})
			}
		}
	}
	for _, p := range parts {
		if len(p.stages) == 0 {
			continue
		}
		last := p.stages[len(p.stages)-1]
		for port, cs := range g.consumers[last] {
			for _, c := range cs {
				if c.stage < 0 {
					p.targets = append(p.targets, Target{Port: port, Feeds: -1, Output: c.output})
					continue
				}
				side := 0
				if len(g.from[c.stage]) > 1 {
					side = c.side
				}
				p.targets = append(p.targets, Target{Port: port, Feeds: partOf[c.stage], Side: side})
			}
		}
		if last == g.defaultTo {
			p.targets = append(p.targets, Target{Feeds: -1}) // `output:`, port 0
		}
		// Port 0's targets first (the primary), ports in order: stable.
		slices.SortStableFunc(p.targets, func(a, b Target) int { return a.Port - b.Port })
	}
	// Topological order, the lowest sort key first among the ready parts:
	// a chain keeps its order, a side comes just before what it feeds.
	indeg := make([]int, len(parts))
	for _, p := range parts {
		for _, t := range p.targets {
			if t.Feeds >= 0 {
				indeg[t.Feeds]++
			}
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
		for _, t := range parts[best].targets {
			if t.Feeds >= 0 {
				indeg[t.Feeds]--
			}
		}
	}
	index := make([]int, len(parts))
	for k, pi := range order {
		index[pi] = k
	}
	subs := make([]SubTopology, len(parts))
	for k, pi := range order {
		p := parts[pi]
		s := SubTopology{Index: k, Input: p.input, Sides: p.sides}
		for _, i := range p.stages {
			s.Stages = append(s.Stages, j.Stages[i])
		}
		for _, t := range p.targets {
			if t.Feeds >= 0 {
				t.Feeds = index[t.Feeds]
			}
			s.Targets = append(s.Targets, t)
		}
		subs[k] = s
	}
	return subs
}
