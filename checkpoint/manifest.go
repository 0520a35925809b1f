package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"cairn/state"
)

// FormatVersion is the manifest format this package writes and reads.
//
// INVARIANT: bump it for any change of the manifest fields' meaning, the
// store layout, or the canonical (full) data format; Decode refuses other
// versions.
const FormatVersion = 1

// FormatVersion2 is the manifest format of a manifest that records state
// versions or an origin (Manifest.StateVersions, Manifest.Origin): a
// build that reads only FormatVersion refuses it by its version (a clear
// "use a newer cairn") instead of as a damaged manifest (unknown fields).
// A manifest without those fields is still written as FormatVersion, so
// jobs that do not use them stay readable by older builds. The canonical
// data and index formats are unchanged (FormatVersion).
const FormatVersion2 = 2

// ErrUnsupportedVersion is returned (wrapped, by Decode) for a manifest of a
// format version this build cannot read.
var ErrUnsupportedVersion = errors.New("checkpoint: unsupported manifest format version")

// Mode is how a checkpoint stores state.
type Mode string

const (
	// ModeIncremental uploads Pebble's native files; SSTs are shared between
	// checkpoints under content-hash names.
	ModeIncremental Mode = "incremental"
	// ModeFull writes the canonical format: per slot, key-ordered pairs as
	// zstd, one frame per key group, plus an index. It references nothing
	// older.
	ModeFull Mode = "full"
)

// Kind is the role of an object in a checkpoint.
type Kind string

const (
	// KindSST is a Pebble SST in shared/ (incremental).
	KindSST Kind = "sst"
	// KindMeta is another Pebble file (MANIFEST, OPTIONS, markers, WAL),
	// private to the checkpoint (incremental).
	KindMeta Kind = "meta"
	// KindFullData is a slot's data file of a full checkpoint (canonical
	// format: one zstd frame, a "segment", per key group). The value
	// "segment" is the format's and never changes.
	KindFullData Kind = "segment"
	// KindIndex is a slot's canonical index (full).
	KindIndex Kind = "index"
)

// Object is one file a checkpoint references.
type Object struct {
	// Path is the object's name in the store, relative to the store base
	// (it includes the job).
	Path string `json:"path"`
	// File is the file's name inside the slot's local Pebble directory
	// (incremental) or its role name (full: data.zst, index.json).
	File string `json:"file"`
	// Size is the length in bytes.
	Size int64 `json:"size"`
	// SHA256 is the hex SHA-256 of the content.
	SHA256 string `json:"sha256"`
	// Kind is the object's role.
	Kind Kind `json:"kind"`
	// Slot is the slot whose state the object holds.
	Slot int `json:"slot"`
}

// SlotInfo is one slot of a checkpoint.
type SlotInfo struct {
	Slot  int                 `json:"slot"`
	Range state.KeyGroupRange `json:"range"`
}

// Figures are a checkpoint's measured numbers (docs/DESIGN.md, "Numbers that are
// part of the product").
type Figures struct {
	// SyncMax is the longest synchronous part over the slots.
	SyncMax time.Duration `json:"sync_max_ns"`
	// SyncPerSlot is each slot's synchronous part, by slot.
	SyncPerSlot []time.Duration `json:"sync_per_slot_ns"`
	// Async is the upload and commit time, until the manifest is written.
	Async time.Duration `json:"async_ns"`
	// BytesUploaded is the bytes this checkpoint wrote to the store (data,
	// without the manifest).
	BytesUploaded int64 `json:"bytes_uploaded"`
	// FilesUploaded is the number of objects it wrote.
	FilesUploaded int `json:"files_uploaded"`
	// FilesReused is the number of shared objects it references that a
	// committed checkpoint had already uploaded.
	FilesReused int `json:"files_reused"`
	// BytesReused is their size.
	BytesReused int64 `json:"bytes_reused"`
	// FullStateSize is the total size of every object it references: what a
	// restore from nothing downloads.
	FullStateSize int64 `json:"full_state_size"`
	// StoreBandwidth is the store throughput last measured by this writer
	// (bytes/s of its uploads of at least 256 KiB); 0 when none yet.
	StoreBandwidth int64 `json:"store_bandwidth_bytes_per_s,omitempty"`
	// PredictedRestore is FullStateSize ÷ StoreBandwidth: how long a
	// restore from the store would take to fetch this checkpoint. It is a
	// prediction from measurements, never the checkpoint duration.
	PredictedRestore time.Duration `json:"predicted_restore_ns,omitempty"`
}

// Manifest describes one committed checkpoint (or savepoint). Its presence
// in the store is the commit: a checkpoint without a manifest does not exist.
type Manifest struct {
	FormatVersion int       `json:"format_version"`
	Job           string    `json:"job"`
	ID            uint64    `json:"id"`
	Mode          Mode      `json:"mode"`
	Time          time.Time `json:"time"`
	KeyGroups     int       `json:"key_groups"`
	// Slots lists every slot with its key-group range; the slot count is
	// len(Slots).
	Slots        []SlotInfo `json:"slots"`
	SourceStream string     `json:"source_stream"`
	// SourceSeq is the stream sequence of the last record before the
	// barrier; a restored job consumes from SourceSeq+1.
	SourceSeq uint64 `json:"source_seq"`
	// Parent is the previous checkpoint of an incremental chain (0: none).
	Parent uint64 `json:"parent,omitempty"`
	// ChainLength counts consecutive incremental checkpoints ending at this
	// one (1 for a full checkpoint or a chain start).
	ChainLength int `json:"chain_length"`
	// Modules maps each stage to its module's SHA-256.
	Modules    map[string]string `json:"modules,omitempty"`
	ABIVersion int               `json:"abi_version"`
	// StateVersions maps each stage whose module declares a state
	// version (other than 0, "none declared") to that version: the
	// shape of the state the stage wrote. A restore onto a module that
	// declares another version is refused unless the state is migrated.
	// Manifests of older builds have none: every stage at version 0.
	StateVersions map[string]int `json:"state_versions,omitempty"`
	// Origin says where the state of a savepoint that a state tool wrote
	// (`cairn state migrate|import`) came from; nil for one a job took.
	Origin  *Origin  `json:"origin,omitempty"`
	Objects []Object `json:"objects"`
	Figures Figures  `json:"figures"`
	// Checksum is the SHA-256 of the manifest's encoding with this field
	// empty: a flipped bit anywhere (a source_seq digit, a size) is detected.
	Checksum string `json:"checksum"`
}

// Origin is where a tool-written savepoint's state came from.
type Origin struct {
	// Tool is "migrate" or "import".
	Tool string `json:"tool"`
	// From is what was read: "savepoint:NAME" or a checkpoint id of the
	// same job, or the imported file's name.
	From string `json:"from"`
	// FromID is the id of the checkpoint or savepoint read (0 for a file).
	FromID uint64 `json:"from_id,omitempty"`
	// Steps lists what was done, in order, for people ("stage count:
	// migrate.wasm sha256 ab12.. to state version 2", "drop stage x").
	Steps []string `json:"steps,omitempty"`
	// NewInput: the savepoint starts a sub-topology that is new (a stage
	// moved or split off behind a repartition stream, `cairn state migrate
	// --into`) at the first message of its input, which it has never read:
	// a restore creates that repartition stream when it is missing instead
	// of refusing for lost messages.
	NewInput bool `json:"new_input,omitempty"`
}

// needsV2 reports whether the manifest holds fields of FormatVersion2.
func (m *Manifest) needsV2() bool { return len(m.StateVersions) > 0 || m.Origin != nil }

// SlotCount is the number of slots the checkpoint was taken with.
func (m *Manifest) SlotCount() int { return len(m.Slots) }

// SlotObjects returns the objects of one slot.
func (m *Manifest) SlotObjects(slot int) []Object {
	var out []Object
	for _, o := range m.Objects {
		if o.Slot == slot {
			out = append(out, o)
		}
	}
	return out
}

// Encode renders the manifest as indented JSON.
func (m *Manifest) Encode() ([]byte, error) {
	if m.FormatVersion == FormatVersion && m.needsV2() {
		m.FormatVersion = FormatVersion2
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	c := *m
	return encodeChecksummed(&c, &c.Checksum, &m.Checksum)
}

// encodeChecksummed renders v (a copy, whose checksum field is sum) as
// indented JSON with sum set to the SHA-256 of the encoding with sum
// empty; the checksum is also stored in orig.
func encodeChecksummed(v any, sum, orig *string) ([]byte, error) {
	*sum = ""
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256(b)
	*sum = hex.EncodeToString(h[:])
	*orig = *sum
	return json.MarshalIndent(v, "", "  ")
}

// checksumField is how Encode writes the checksum (json.MarshalIndent).
var checksumField = []byte(`"checksum": "`)

// verifyChecksum checks the manifest's bytes as stored, not a re-encoding
// of what they decoded to: JSON decoding forgives some damage (keys match
// case-insensitively, so a flipped case bit in a key decodes to the same
// manifest), the checksum must not. The recorded value is replaced by ""
// and the result hashed, which is exactly what Encode hashed.
func verifyChecksum(data []byte, recorded string) error {
	i := bytes.LastIndex(data, checksumField)
	if i < 0 || len(recorded) != sha256.Size*2 {
		return errors.New("checkpoint: manifest checksum missing")
	}
	start := i + len(checksumField)
	if len(data) < start+len(recorded)+1 || string(data[start:start+len(recorded)]) != recorded || data[start+len(recorded)] != '"' {
		return errors.New("checkpoint: manifest checksum field damaged")
	}
	h := sha256.New()
	h.Write(data[:start])
	h.Write(data[start+len(recorded):])
	if got := hex.EncodeToString(h.Sum(nil)); got != recorded {
		return fmt.Errorf("checkpoint: manifest checksum mismatch (content %s, recorded %s)", got[:12], recorded[:12])
	}
	return nil
}

// DecodeObject is Decode for the manifest stored at name: any error but an
// unsupported version is a *CorruptionError naming the object.
func DecodeObject(name string, data []byte) (*Manifest, error) {
	m, err := Decode(data)
	if err != nil && !errors.Is(err, ErrUnsupportedVersion) {
		return nil, &CorruptionError{Object: name, Reason: err.Error()}
	}
	return m, err
}

// Decode parses and validates a manifest.
func Decode(data []byte) (*Manifest, error) {
	var probe struct {
		FormatVersion *int `json:"format_version"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, fmt.Errorf("checkpoint: decode manifest: %w", err)
	}
	if probe.FormatVersion == nil {
		return nil, fmt.Errorf("checkpoint: decode manifest: no format_version")
	}
	if v := *probe.FormatVersion; v != FormatVersion && v != FormatVersion2 {
		return nil, fmt.Errorf("%w %d (this build reads %d and %d; use a newer cairn)", ErrUnsupportedVersion, v, FormatVersion, FormatVersion2)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("checkpoint: decode manifest: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("checkpoint: decode manifest: trailing data")
	}
	if err := verifyChecksum(data, m.Checksum); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Validate checks the manifest's internal consistency.
func (m *Manifest) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("checkpoint: invalid manifest %s/%d: %s", m.Job, m.ID, fmt.Sprintf(format, args...))
	}
	if m.FormatVersion != FormatVersion && m.FormatVersion != FormatVersion2 {
		return fmt.Errorf("%w %d", ErrUnsupportedVersion, m.FormatVersion)
	}
	if m.FormatVersion == FormatVersion && m.needsV2() {
		return bad("format_version %d with state_versions or origin (format %d fields)", m.FormatVersion, FormatVersion2)
	}
	for stage, v := range m.StateVersions {
		if stage == "" || v <= 0 {
			return bad("state version %d of stage %q", v, stage)
		}
	}
	if err := validJob(m.Job); err != nil {
		return bad("%v", err)
	}
	if m.ID == 0 {
		return bad("id 0")
	}
	if m.Mode != ModeIncremental && m.Mode != ModeFull {
		return bad("mode %q", m.Mode)
	}
	if err := state.ValidateKeyGroups(m.KeyGroups); err != nil {
		return bad("%v", err)
	}
	if err := state.ValidateSlots(len(m.Slots), m.KeyGroups); err != nil {
		return bad("%v", err)
	}
	for i, s := range m.Slots {
		if s.Slot != i || s.Range != state.SlotRange(i, len(m.Slots), m.KeyGroups) {
			return bad("slot %d: range %v, want slot %d with %v", s.Slot, s.Range, i, state.SlotRange(i, len(m.Slots), m.KeyGroups))
		}
	}
	if m.ChainLength < 1 {
		return bad("chain_length %d", m.ChainLength)
	}
	seen := map[string]bool{}
	for _, o := range m.Objects {
		if err := validName(o.Path); err != nil || !strings.HasPrefix(o.Path, m.Job+"/") {
			return bad("object path %q", o.Path)
		}
		if k := fmt.Sprint(o.Slot, " ", o.Path); seen[k] {
			return bad("object %s listed twice for slot %d", o.Path, o.Slot)
		} else {
			seen[k] = true
		}
		if o.Size < 0 || o.Slot < 0 || o.Slot >= len(m.Slots) {
			return bad("object %s: size %d slot %d", o.Path, o.Size, o.Slot)
		}
		if h, err := hex.DecodeString(o.SHA256); err != nil || len(h) != 32 {
			return bad("object %s: sha256 %q", o.Path, o.SHA256)
		}
		switch o.Kind {
		case KindSST, KindMeta, KindFullData, KindIndex:
		default:
			return bad("object %s: kind %q", o.Path, o.Kind)
		}
		if o.File == "" || strings.ContainsAny(o.File, "/\\") || o.File == "." || o.File == ".." {
			return bad("object %s: file %q", o.Path, o.File)
		}
	}
	return nil
}

// validJob checks a job name: one path segment of [A-Za-z0-9._-].
func validJob(job string) error {
	if job == "" || job == "." || job == ".." || len(job) > 200 {
		return fmt.Errorf("job name %q", job)
	}
	for _, c := range job {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("job name %q: only letters, digits, '.', '-', '_'", job)
		}
	}
	return nil
}

// Store layout. INVARIANT: part of the on-store format (FormatVersion).
const (
	manifestName = "MANIFEST.json"
	chkPrefix    = "chk-"
	idDigits     = 20
)

// CheckpointDir is the folder of checkpoint id: <job>/chk-<20-digit id>.
func CheckpointDir(job string, id uint64) string {
	return fmt.Sprintf("%s/%s%0*d", job, chkPrefix, idDigits, id)
}

// ManifestPath is the manifest object of checkpoint id.
func ManifestPath(job string, id uint64) string {
	return CheckpointDir(job, id) + "/" + manifestName
}

// SlotDir is the private folder of one slot of checkpoint id.
func SlotDir(job string, id uint64, slot int) string {
	return fmt.Sprintf("%s/slot-%d", CheckpointDir(job, id), slot)
}

// SharedPath is the content-addressed path of an SST with hex SHA-256 sum.
func SharedPath(job, sum string) string {
	return fmt.Sprintf("%s/shared/%s/%s.sst", job, sum[:2], sum)
}

// SavepointDir is the folder of savepoint name.
func SavepointDir(job, name string) string { return job + "/savepoints/" + name }

// parseCheckpointDir returns the id of an object under <job>/chk-<id>/.
func parseCheckpointDir(job, name string) (id uint64, rest string, ok bool) {
	p := job + "/" + chkPrefix
	if !strings.HasPrefix(name, p) {
		return 0, "", false
	}
	s := name[len(p):]
	i := strings.IndexByte(s, '/')
	if i != idDigits {
		return 0, "", false
	}
	id, err := strconv.ParseUint(s[:i], 10, 64)
	if err != nil {
		return 0, "", false
	}
	return id, s[i+1:], true
}

// isSavepoint reports whether name lies under <job>/savepoints/.
func isSavepoint(job, name string) bool {
	return strings.HasPrefix(name, job+"/savepoints/")
}

// isManifest reports whether name is a manifest object.
func isManifest(name string) bool { return path.Base(name) == manifestName }
