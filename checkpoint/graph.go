package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// A job graph runs as sub-topologies, each with its own checkpoint chain
// (<job>, <job>.s1, ...). A graph checkpoint is one manifest over all of
// them: which committed checkpoint of each sub-topology, with its slots and
// input position, makes up the graph at that point. It references those
// checkpoints; it holds no state of its own, so retention follows the
// sub-topologies' chains: a graph checkpoint is kept while every
// checkpoint it names exists (PruneGraphs).
//
// Store layout: <job>/graph/chk-<20-digit id>.json, written once with a
// conditional create like a checkpoint manifest. Its id is the first
// sub-topology's checkpoint in it, so `--restore ID` and `checkpoints show
// ID` name the same point of the graph.

// GraphFormatVersion is the graph manifest format this package writes and
// reads. INVARIANT: bump it for any change of its fields' meaning.
const GraphFormatVersion = 1

// GraphPart is one sub-topology's checkpoint in a graph checkpoint.
type GraphPart struct {
	// Name is the sub-topology's chain: the job's name for the first,
	// <job>.s<k> for sub-topology k.
	Name       string    `json:"name"`
	Checkpoint uint64    `json:"checkpoint"`
	Mode       Mode      `json:"mode"`
	Time       time.Time `json:"time"`
	Slots      int       `json:"slots"`
	KeyGroups  int       `json:"key_groups"`
	// SourceStream and SourceSeq are the stream the sub-topology reads
	// (the job's input, or the repartition stream before it) and its
	// position in that checkpoint.
	SourceStream string `json:"source_stream"`
	SourceSeq    uint64 `json:"source_seq"`
	// FullStateSize and PredictedRestore are the checkpoint's own figures.
	FullStateSize    int64         `json:"full_state_size"`
	PredictedRestore time.Duration `json:"predicted_restore_ns,omitempty"`
}

// GraphManifest is one committed graph checkpoint.
type GraphManifest struct {
	FormatVersion int         `json:"format_version"`
	Job           string      `json:"job"`
	ID            uint64      `json:"id"`
	Time          time.Time   `json:"time"`
	Parts         []GraphPart `json:"parts"`
	Checksum      string      `json:"checksum"`
}

// GraphOf builds the graph checkpoint over the given sub-topology
// checkpoints, the first sub-topology's first.
func GraphOf(job string, now time.Time, parts []*Manifest) *GraphManifest {
	g := &GraphManifest{FormatVersion: GraphFormatVersion, Job: job, Time: now.UTC()}
	for _, m := range parts {
		g.Parts = append(g.Parts, GraphPart{
			Name: m.Job, Checkpoint: m.ID, Mode: m.Mode, Time: m.Time, Slots: len(m.Slots), KeyGroups: m.KeyGroups,
			SourceStream: m.SourceStream, SourceSeq: m.SourceSeq,
			FullStateSize: m.Figures.FullStateSize, PredictedRestore: m.Figures.PredictedRestore,
		})
	}
	if len(parts) > 0 {
		g.ID = parts[0].ID
	}
	return g
}

// Part returns the part of the sub-topology called name.
func (g *GraphManifest) Part(name string) (GraphPart, bool) {
	for _, p := range g.Parts {
		if p.Name == name {
			return p, true
		}
	}
	return GraphPart{}, false
}

// Validate checks the graph manifest's internal consistency.
func (g *GraphManifest) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("checkpoint: invalid graph manifest %s/%d: %s", g.Job, g.ID, fmt.Sprintf(format, args...))
	}
	if g.FormatVersion != GraphFormatVersion {
		return fmt.Errorf("%w %d (graph manifest)", ErrUnsupportedVersion, g.FormatVersion)
	}
	if err := validJob(g.Job); err != nil {
		return bad("%v", err)
	}
	if g.ID == 0 {
		return bad("id 0")
	}
	if len(g.Parts) < 2 {
		return bad("%d parts: a graph has at least two sub-topologies", len(g.Parts))
	}
	for k, p := range g.Parts {
		want := g.Job
		if k > 0 {
			want = g.Job + ".s" + strconv.Itoa(k)
		}
		if p.Name != want {
			return bad("part %d is %q, want %q", k, p.Name, want)
		}
		if p.Checkpoint == 0 || p.Slots < 1 || (p.Mode != ModeIncremental && p.Mode != ModeFull) {
			return bad("part %s: checkpoint %d, %d slots, mode %q", p.Name, p.Checkpoint, p.Slots, p.Mode)
		}
	}
	if g.Parts[0].Checkpoint != g.ID {
		return bad("the first part's checkpoint is %d", g.Parts[0].Checkpoint)
	}
	return nil
}

// Encode renders the graph manifest as indented JSON with its checksum
// (the SHA-256 of the encoding with the checksum empty, as a manifest's).
func (g *GraphManifest) Encode() ([]byte, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	c := *g
	return encodeChecksummed(&c, &c.Checksum, &g.Checksum)
}

// DecodeGraph parses and verifies the graph manifest stored at name: any
// error but an unsupported version is a *CorruptionError naming it.
func DecodeGraph(name string, data []byte) (*GraphManifest, error) {
	var probe struct {
		FormatVersion *int `json:"format_version"`
	}
	if err := json.Unmarshal(data, &probe); err != nil || probe.FormatVersion == nil {
		return nil, &CorruptionError{Object: name, Reason: fmt.Sprintf("not a graph manifest: %v", cmpErr(err, "no format_version"))}
	}
	if v := *probe.FormatVersion; v != GraphFormatVersion {
		return nil, fmt.Errorf("%s: %w %d (this build reads graph manifests of version %d; use a newer cairn)", name, ErrUnsupportedVersion, v, GraphFormatVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var g GraphManifest
	err := dec.Decode(&g)
	if err == nil && dec.More() {
		err = errors.New("trailing data")
	}
	if err == nil {
		err = verifyChecksum(data, g.Checksum)
	}
	if err == nil {
		err = g.Validate()
	}
	if err == nil && name != GraphPath(g.Job, g.ID) {
		err = fmt.Errorf("it says it is %s", GraphPath(g.Job, g.ID))
	}
	if err != nil {
		return nil, &CorruptionError{Object: name, Reason: err.Error()}
	}
	return &g, nil
}

func cmpErr(err error, otherwise string) string {
	if err != nil {
		return err.Error()
	}
	return otherwise
}

// Store layout of graph manifests. INVARIANT: on-store format.
const graphDir = "graph"

// GraphPath is the object of graph checkpoint id of job.
func GraphPath(job string, id uint64) string {
	return fmt.Sprintf("%s/%s/%s%0*d.json", job, graphDir, chkPrefix, idDigits, id)
}

// isGraphManifest reports whether name is a graph manifest of job (by its
// name: GC leaves these to PruneGraphs).
func isGraphManifest(job, name string) bool {
	_, ok := parseGraphPath(job, name)
	return ok
}

func parseGraphPath(job, name string) (uint64, bool) {
	p := job + "/" + graphDir + "/" + chkPrefix
	s, ok := strings.CutPrefix(name, p)
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".json")
	if !ok || len(s) != idDigits {
		return 0, false
	}
	id, err := strconv.ParseUint(s, 10, 64)
	return id, err == nil
}

// CommitGraph writes a graph manifest; it never replaces one (ErrExists).
func CommitGraph(ctx context.Context, s Store, g *GraphManifest) error {
	b, err := g.Encode()
	if err != nil {
		return err
	}
	if err := s.Create(ctx, GraphPath(g.Job, g.ID), b); err != nil {
		return fmt.Errorf("checkpoint: commit graph checkpoint %s/%d: %w", g.Job, g.ID, err)
	}
	return nil
}

// LoadGraph reads graph checkpoint id of job (ErrNotFound when there is
// none).
func LoadGraph(ctx context.Context, s Store, job string, id uint64) (*GraphManifest, error) {
	name := GraphPath(job, id)
	b, err := readAll(ctx, s, name)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: graph checkpoint %d of %s: %w", id, job, err)
	}
	return DecodeGraph(name, b)
}

// GraphIDs lists the ids of job's graph manifests, ascending.
func GraphIDs(ctx context.Context, s Store, job string) ([]uint64, error) {
	var ids []uint64
	err := s.List(ctx, job+"/"+graphDir+"/", func(o ObjectInfo) error {
		if id, ok := parseGraphPath(job, o.Name); ok {
			ids = append(ids, id)
		}
		return nil
	})
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, err
}

// ListGraphs reads every graph checkpoint of job, oldest first; those that
// do not decode are returned as errors beside them (a *CorruptionError or
// an unsupported version each).
func ListGraphs(ctx context.Context, s Store, job string) ([]*GraphManifest, []error, error) {
	ids, err := GraphIDs(ctx, s, job)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: list graph checkpoints of %s: %w", job, err)
	}
	var gs []*GraphManifest
	var bad []error
	for _, id := range ids {
		g, err := LoadGraph(ctx, s, job, id)
		switch {
		case err == nil:
			gs = append(gs, g)
		case errors.Is(err, ErrNotFound): // pruned meanwhile
		case IsCorruption(err) || errors.Is(err, ErrUnsupportedVersion):
			bad = append(bad, err)
		default:
			return nil, nil, err
		}
	}
	return gs, bad, nil
}

// Stale reports whether g names a checkpoint that exists says is gone:
// such a graph checkpoint can no longer be restored and is pruned.
func (g *GraphManifest) Stale(exists func(name string, id uint64) bool) bool {
	return slices.ContainsFunc(g.Parts, func(p GraphPart) bool { return !exists(p.Name, p.Checkpoint) })
}

// PruneGraphs deletes job's graph manifests that name a checkpoint which
// no longer exists (retention dropped it), and those that do not decode;
// exists says whether sub-topology chain name still has checkpoint id. It
// returns the ids deleted.
func PruneGraphs(ctx context.Context, s Store, job string, exists func(name string, id uint64) bool) ([]uint64, error) {
	ids, err := GraphIDs(ctx, s, job)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: prune graph checkpoints of %s: %w", job, err)
	}
	var gs []*GraphManifest
	var deleted []uint64
	for _, id := range ids {
		g, err := LoadGraph(ctx, s, job, id)
		switch {
		case err == nil:
			gs = append(gs, g)
		case errors.Is(err, ErrNotFound):
		case IsCorruption(err): // names nothing restorable
			if err := s.Delete(ctx, GraphPath(job, id)); err != nil {
				return deleted, fmt.Errorf("checkpoint: prune graph checkpoint %s/%d: %w", job, id, err)
			}
			deleted = append(deleted, id)
		default:
			return deleted, err // unreadable or of a newer format: not ours to remove
		}
	}
	_, more, err := PruneGraphList(ctx, s, gs, exists)
	deleted = append(deleted, more...)
	slices.Sort(deleted)
	return deleted, err
}

// RemoveGraphsNaming deletes those of gs that name one of checkpoints ids
// of sub-topology chain name, as retention must before it drops them
// (Writer.SetBeforeDrop, GCBeforeDrop), and returns the ones kept and the
// ids deleted; on an error, kept holds every one not deleted.
func RemoveGraphsNaming(ctx context.Context, s Store, gs []*GraphManifest, name string, ids []uint64) (kept []*GraphManifest, deleted []uint64, err error) {
	return PruneGraphList(ctx, s, gs, func(n string, id uint64) bool { return n != name || !slices.Contains(ids, id) })
}

// PruneGraphList is PruneGraphs over graph manifests already read: it
// deletes those of gs that name a checkpoint exists says is gone, reads
// nothing, and returns the ones kept and the ids deleted.
func PruneGraphList(ctx context.Context, s Store, gs []*GraphManifest, exists func(name string, id uint64) bool) (kept []*GraphManifest, deleted []uint64, err error) {
	for i, g := range gs {
		if !g.Stale(exists) {
			kept = append(kept, g)
			continue
		}
		if err := s.Delete(ctx, GraphPath(g.Job, g.ID)); err != nil {
			return append(kept, gs[i:]...), deleted, fmt.Errorf("checkpoint: prune graph checkpoint %s/%d: %w", g.Job, g.ID, err)
		}
		deleted = append(deleted, g.ID)
	}
	return kept, deleted, nil
}
