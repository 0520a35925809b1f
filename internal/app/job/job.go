// Package job parses and validates cairn job files (YAML). A bad job file is
// rejected before anything starts, with the field and the reason.
package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"cairn/nexmark"
	"cairn/state"
)

// Job is a parsed job file. Field names follow docs/JOBS.md.
type Job struct {
	Name     string   `yaml:"name"`
	NATS     string   `yaml:"nats"`
	NATSAuth NATSAuth `yaml:"nats_auth"`
	Input    Input    `yaml:"input,omitempty"`
	// Inputs, instead of Input, names several input streams; stages name
	// the ones they read (Stage.From).
	Inputs []Input `yaml:"inputs,omitempty"`
	Stages []Stage `yaml:"stages"`
	Output Output  `yaml:"output,omitempty"`
	// Outputs are named outputs, each fed by a stage's port (`from:`);
	// they share output.delivery and output.publish.
	Outputs    []NamedOutput `yaml:"outputs,omitempty"`
	DeadLetter DeadLetter    `yaml:"dead_letter"`
	KeyGroups  int           `yaml:"key_groups"`
	Slots      int           `yaml:"slots"`
	DataDir    string        `yaml:"data_dir"`
	HTTP       string        `yaml:"http"`
	Watermark  Watermark     `yaml:"watermark"`
	BatchSize  int           `yaml:"batch_size"`
	MaxMessage int           `yaml:"max_message_bytes"`
	Checkpoint *Checkpoint   `yaml:"checkpoint"`
	Savepoints Savepoints    `yaml:"savepoints"`
	Restore    Restore       `yaml:"restore"`

	// MaxKeyBytes: a record with a longer key is dead-lettered (default
	// DefaultMaxKeyBytes, at most MaxKeyBytesLimit).
	MaxKeyBytes int `yaml:"max_key_bytes"`

	// Memory is the process's memory budget (e.g. 256MiB; "" none),
	// divided among Pebble, the operator instances, the embedded NATS
	// server and the Go runtime (docs/JOBS.md, "Memory").
	Memory string `yaml:"memory,omitempty"`

	// Group, when set, makes every `cairn run` of this job with the same
	// NATS cluster and store a member of one group that divides the job's
	// sub-topologies among them (docs/SCALING.md).
	Group *Group `yaml:"group,omitempty"`

	// Dir is the job file's directory: relative module paths resolve against it.
	Dir string `yaml:"-"`
	// Extra are a sub-topology's outputs besides Output (the command
	// line sets them from Graph; never in a job file).
	Extra []ExtraOutput `yaml:"-"`
}

// Group is a job's group section.
type Group struct {
	// Members is "auto": any number of processes may join.
	Members string `yaml:"members"`
	// LeaseTTL is how long a member that stopped renewing keeps its
	// sub-topologies before the others take them over (default 10s).
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Replicas of the group's KV bucket (default 1; 3 on a three-node
	// cluster so that a node's loss keeps the group).
	Replicas int `yaml:"replicas"`
}

// DefaultGroupLeaseTTL is a group member's lease when the job names none.
const DefaultGroupLeaseTTL = 10 * time.Second

// NATSAuth holds the usual NATS credentials. Secrets never appear in logs:
// String and GoString print only which fields are set. Relative paths are
// relative to the job file, like module paths.
type NATSAuth struct {
	CredsFile string `yaml:"creds_file"`
	NKeyFile  string `yaml:"nkey_file"`
	User      string `yaml:"user"`
	Password  string `yaml:"password"`
	// PasswordFile holds the password (trailing white space trimmed): a
	// secret kept out of the job file.
	PasswordFile string `yaml:"password_file"`
	Token        string `yaml:"token"`
	// TokenFile holds the token (trailing white space trimmed).
	TokenFile string `yaml:"token_file"`
	TLSCA     string `yaml:"tls_ca"`
	TLSCert   string `yaml:"tls_cert"`
	TLSKey    string `yaml:"tls_key"`
}

// String lists the fields that are set, never a secret's value, so that a
// job printed by mistake (%v, %+v) carries no secret.
func (a NATSAuth) String() string {
	var set []string
	for _, f := range []struct {
		name string
		v    string
	}{{"creds_file", a.CredsFile}, {"nkey_file", a.NKeyFile}, {"user", a.User}, {"password", a.Password},
		{"password_file", a.PasswordFile}, {"token", a.Token}, {"token_file", a.TokenFile},
		{"tls_ca", a.TLSCA}, {"tls_cert", a.TLSCert}, {"tls_key", a.TLSKey}} {
		if f.v != "" {
			set = append(set, f.name)
		}
	}
	return "nats_auth{" + strings.Join(set, ",") + "}"
}

// GoString is String: %#v must not print secrets either.
func (a NATSAuth) GoString() string { return a.String() }

// Savepoints configures the savepoint lifecycle.
type Savepoints struct {
	// Retain, when above 0, keeps only the newest Retain savepoints of the
	// job: after a savepoint commits, older ones are removed. 0 (default)
	// keeps every savepoint until `cairn savepoint rm`.
	Retain int `yaml:"retain"`
}

// Input is a source stream.
type Input struct {
	// Name is what stages call the input in `from:` (an `input:` is
	// called "input").
	Name     string   `yaml:"name,omitempty"`
	Stream   string   `yaml:"stream,omitempty"`
	Subjects []string `yaml:"subjects,omitempty"`
	// Table, instead of Stream, names a NATS KV bucket read as a table:
	// its changelog (the stream KV_<bucket>), a delete as a tombstone. A
	// table is the second input of a two-input stage (a lookup join).
	Table string `yaml:"table,omitempty"`
	// Nexmark, instead of a stream, generates the Nexmark benchmark's
	// events in process (docs/JOBS.md, "Nexmark").
	Nexmark *nexmark.Config `yaml:"nexmark,omitempty"`
}

// NexmarkStream is the input stream name a generated Nexmark input has in
// checkpoints (no such stream exists).
const NexmarkStream = "NEXMARK"

// Stage is one operator of the job graph.
type Stage struct {
	Name   string `yaml:"name"`
	Module string `yaml:"module"` // builtin:NAME, native:NAME or a path to a .wasm file
	Keyed  bool   `yaml:"keyed"`
	// From names what the stage reads: inputs, stages or stage.port, at
	// most two (a join or union reads two: side 0 and side 1). Default:
	// the stage before it (the job's only input for the first stage).
	From []string `yaml:"from,omitempty,flow"`
	// Ports names the stage's output ports, in the order its operator
	// numbers them (sdk.Context.EmitTo); without it the stage has one.
	Ports    []string      `yaml:"ports,omitempty,flow"`
	TTL      time.Duration `yaml:"ttl"`
	Deadline *Duration     `yaml:"deadline"` // per-call deadline; "0" or "off" disables it (trusted operators)
	Memory   string        `yaml:"memory"`   // memory limit, e.g. 256MiB
	Config   any           `yaml:"config"`   // handed to the operator as JSON
	// Clock is the stage's processing clock: ClockIngestion (default) or
	// ClockWall.
	Clock string `yaml:"clock"`
	// Slots, on a keyed stage of a job graph, is its sub-topology's slot
	// count (0: the job's slots).
	Slots int `yaml:"slots,omitempty"`
	// SHA256, when set, pins the module: the SHA-256 of its bytes (64 hex
	// digits) must be this, or the job refuses to start.
	SHA256 string `yaml:"sha256"`
}

// The processing clocks of a stage (Stage.Clock).
const (
	// ClockIngestion: ProcTime, processing-time timers and TTL follow the
	// JetStream timestamps of the input, so a replay sees the same times.
	ClockIngestion = "ingestion"
	// ClockWall: they follow the machine's clock; refused with exactly_once
	// and dedupe delivery, whose replays must regenerate the same outputs.
	ClockWall = "wall"
)

// Defaults and bounds of the bad-input fields. They mirror the engine's
// (engine.DefaultMaxKeyBytes, engine.DefaultMaxFutureSkew); a cli test
// keeps them equal.
const (
	DefaultMaxKeyBytes   = 16 << 10
	MaxKeyBytesLimit     = 60 << 10 // keys travel in a header; the server bounds headers at 64 KiB
	DefaultMaxFutureSkew = 5 * time.Minute
)

// MinMemory is the smallest memory budget a job may have.
const MinMemory = 64 << 20

// Duration is a time.Duration that also accepts "off".
type Duration struct {
	time.Duration
	// Off is true when the field said "off" (Duration is then 0).
	Off bool
}

// UnmarshalYAML accepts Go durations and "off".
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Value == "off" {
		d.Duration, d.Off = 0, true
		return nil
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (like 500ms, 2s) or off", n.Line, n.Value)
	}
	d.Duration, d.Off = v, false
	return nil
}

// MarshalYAML writes "off" or the duration, as UnmarshalYAML reads them.
func (d Duration) MarshalYAML() (any, error) {
	if d.Off {
		return "off", nil
	}
	return d.Duration.String(), nil
}

// Marshal writes the job as a job file that Parse reads back (tests build
// job files from a Job instead of patching YAML text).
// Fields left zero get their defaults first.
func (j *Job) Marshal() ([]byte, error) {
	c := *j
	c.SetDefaults()
	return yaml.Marshal(&c)
}

// Output is where results go.
type Output struct {
	Stream   string `yaml:"stream"`
	Subject  string `yaml:"subject"`
	Delivery string `yaml:"delivery"`
	// Publish: "auto" (default: fast batches for exactly_once and
	// transactional when the stream allows them), "async" or "batch".
	Publish string `yaml:"publish"`
	// Emit: "all" (default, also "") publishes every output; "latest"
	// publishes per key only its latest output of each checkpoint
	// interval (transactional delivery only; docs/JOBS.md, "Delivery").
	Emit string `yaml:"emit,omitempty"`
	// Discard counts the outputs and publishes none (a benchmark's sink).
	Discard bool `yaml:"discard,omitempty"`
}

// NamedOutput is an entry of `outputs:`: a stream and subject fed by a
// stage's port.
type NamedOutput struct {
	Name string `yaml:"name"`
	// From is the stage (or stage.port) whose emits go here.
	From    string `yaml:"from"`
	Stream  string `yaml:"stream"`
	Subject string `yaml:"subject"`
}

// ExtraOutput is a sub-topology's output besides its primary one (set by
// the command line from the graph; never in a job file).
type ExtraOutput struct {
	Port            int
	Stream, Subject string
	Repartition     bool
}

// DeadLetter is where records that cannot be processed go, with the reason.
type DeadLetter struct {
	Stream  string `yaml:"stream"`
	Subject string `yaml:"subject"`
}

// Watermark configures event time.
type Watermark struct {
	MaxOutOfOrderness time.Duration `yaml:"max_out_of_orderness"`
	// MaxFutureSkew: a record whose event time is more than this ahead of
	// its JetStream timestamp is dead-lettered instead of moving the
	// watermark (default DefaultMaxFutureSkew; "off" disables the bound).
	MaxFutureSkew *Duration `yaml:"max_future_skew"`
	// AllowedLateness: an event at or before the watermark (late) is still
	// admitted when it is less than this far behind it; only events
	// further behind are dead letters (default 0: every late event). It
	// applies at every sub-topology's input, so what the job's input
	// admitted is not dead-lettered downstream. Windows keep their state
	// this long after they fire through their own allowed_lateness_ms.
	AllowedLateness time.Duration `yaml:"allowed_lateness"`
}

// Checkpoint configures checkpoints.
type Checkpoint struct {
	Store       string        `yaml:"store"`
	Interval    time.Duration `yaml:"interval"`
	Mode        string        `yaml:"mode"`
	Retain      int           `yaml:"retain"`
	FullEvery   int           `yaml:"full_every"`
	OrphanGrace time.Duration `yaml:"orphan_grace"`
	// RestoreBudget, when set, bounds the predicted restore of the newest
	// checkpoint from the store: when the next incremental checkpoint
	// would restore slower than this and a full one faster, the next one is
	// full (docs/RATIONALE.md, "The restore budget").
	RestoreBudget time.Duration `yaml:"restore_budget"`
	// ScrubRate bounds the background re-reading of shared objects (bytes
	// per second, like 2MiB; "off" disables it; default 2MiB).
	ScrubRate string `yaml:"scrub_rate"`
	// ScrubEvery is how long a shared object stays trusted before the scrub
	// reads it again (default 10m).
	ScrubEvery time.Duration `yaml:"scrub_every"`
}

// Restore configures what a start does when the checkpoint it restores is
// broken.
type Restore struct {
	// Fallback: "none" (default: refuse to start) or "previous" (restore the
	// newest intact older checkpoint instead, and say so).
	Fallback string `yaml:"fallback"`
	// Mode: "download" (default: every file of the checkpoint is local
	// before processing starts) or "online" (processing starts as soon as
	// the slot DBs reference the checkpoint's SSTs in the store; they are
	// read remotely and downloaded in the background). Online applies to
	// an incremental checkpoint restored onto the same or more slots; other
	// restores download, and say why.
	Mode string `yaml:"mode"`
	// DownloadRate bounds an online restore's background download (bytes
	// per second, like 50MiB; default unbounded), so that the download
	// leaves bandwidth to the reads the job makes meanwhile.
	DownloadRate string `yaml:"download_rate"`
	// Prefetch: while an online restore's files are remote, whether a slot
	// reads a call's keys' state ahead, 16 at a time, before the call reads
	// it key by key: "auto" (default: when a miss has been measured to cost
	// at least 0.25 ms, a round trip to a remote store), "on" or "off".
	Prefetch string `yaml:"prefetch"`
}

// Error is a job-file error naming the field and the reason.
type Error struct {
	File   string
	Field  string
	Reason string
	// Line is the field's line in the job file (0: unknown).
	Line int
}

// Error says "job file F: FIELD: REASON"; an error about the whole file
// (Field "") says "job file F REASON".
func (e *Error) Error() string {
	where := "job"
	if e.File != "" {
		where = "job file " + e.File
	}
	if e.Line > 0 {
		if e.File == "" {
			where = "job file"
		}
		where += fmt.Sprintf(" line %d", e.Line)
	}
	if e.Field == "" {
		return where + " " + e.Reason
	}
	return fmt.Sprintf("%s: %s: %s", where, e.Field, e.Reason)
}

// ErrInvalid is matched by every *Error (errors.Is).
var ErrInvalid = errors.New("job: invalid job file")

// Is makes errors.Is(err, ErrInvalid) true for job errors.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Load reads and validates a job file.
func Load(path string) (*Job, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("job: read %s: %w", path, err)
	}
	j, err := Parse(b)
	if err != nil {
		var je *Error
		if errors.As(err, &je) {
			je.File = path
		}
		return nil, err
	}
	j.Dir = filepath.Dir(path)
	return j, nil
}

// Parse decodes a job file (unknown fields are errors) and validates it.
func Parse(b []byte) (*Job, error) {
	var j Job
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&j); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{Reason: "is empty: a job needs at least name, input, stages and output (see docs/JOBS.md)"}
		}
		return nil, &Error{Field: "(yaml)", Reason: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	// Absent fields take their defaults; a zero written out is a mistake,
	// not a request for the default, so it is refused. Only presence is
	// read here: the decode above already checked the types.
	var given struct {
		Slots       *int `yaml:"slots"`
		MaxKeyBytes *int `yaml:"max_key_bytes"`
	}
	_ = yaml.Unmarshal(b, &given)
	j.SetDefaults()
	if given.Slots != nil && *given.Slots == 0 {
		return nil, &Error{Field: "slots", Reason: fmt.Sprintf("0 must be in [1, key_groups=%d] (leave slots out for the default 1)", j.KeyGroups)}
	}
	if given.MaxKeyBytes != nil && *given.MaxKeyBytes == 0 {
		return nil, &Error{Field: "max_key_bytes", Reason: fmt.Sprintf("0 must be in [1, %d] (leave max_key_bytes out for the default %d)", MaxKeyBytesLimit, DefaultMaxKeyBytes)}
	}
	if err := j.Validate(); err != nil {
		var je *Error
		if errors.As(err, &je) && je.Line == 0 {
			var root yaml.Node
			if yaml.Unmarshal(b, &root) == nil {
				je.Line = lineOf(&root, je.Field)
			}
		}
		return nil, err
	}
	return &j, nil
}

// lineOf finds the line of a field path like "stages[2].from[1]" in a
// decoded document: the deepest node of the path that exists (0: none).
func lineOf(root *yaml.Node, field string) int {
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := 0
	for _, part := range strings.Split(field, ".") {
		name, rest, _ := strings.Cut(part, "[")
		if n.Kind != yaml.MappingNode {
			return line
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == name {
				line, next = n.Content[i].Line, n.Content[i+1]
				break
			}
		}
		if next == nil {
			return line
		}
		n = next
		for rest != "" {
			idx, after, _ := strings.Cut(rest, "]")
			rest = strings.TrimPrefix(after, "[")
			var k int
			if _, err := fmt.Sscan(idx, &k); err != nil || n.Kind != yaml.SequenceNode || k < 0 || k >= len(n.Content) {
				return line
			}
			n = n.Content[k]
			line = n.Line
		}
	}
	return line
}

// SetDefaults fills the fields a job may leave out.
func (j *Job) SetDefaults() {
	if j.NATS == "" {
		j.NATS = "embedded"
	}
	if j.KeyGroups == 0 {
		j.KeyGroups = state.DefaultKeyGroups
	}
	if j.Slots == 0 {
		j.Slots = 1
	}
	if j.DataDir == "" {
		j.DataDir = "./cairn-data"
	}
	if j.HTTP == "" {
		j.HTTP = "127.0.0.1:8080"
	}
	if j.MaxKeyBytes == 0 {
		j.MaxKeyBytes = DefaultMaxKeyBytes
	}
	if j.Watermark.MaxFutureSkew == nil {
		j.Watermark.MaxFutureSkew = &Duration{Duration: DefaultMaxFutureSkew}
	}
	for i := range j.Stages {
		if j.Stages[i].Clock == "" {
			j.Stages[i].Clock = ClockIngestion
		}
	}
	if j.Restore.Fallback == "" {
		j.Restore.Fallback = "none"
	}
	if j.Restore.Mode == "" {
		j.Restore.Mode = "download"
	}
	if j.Restore.Prefetch == "" {
		j.Restore.Prefetch = "auto"
	}
	if j.Output.Discard {
		if j.Output.Subject == "" {
			j.Output.Subject = "cairn.discard." + j.Name // never published to
		}
		if j.Output.Delivery == "" {
			j.Output.Delivery = "core" // no stream to create
		}
	}
	if nx := j.Input.Nexmark; nx != nil {
		nx.SetDefaults()
		if j.Input.Stream == "" {
			j.Input.Stream = NexmarkStream
		}
	}
	if j.Output.Publish == "" {
		j.Output.Publish = "auto"
	}
	if g := j.Group; g != nil {
		if g.Members == "" {
			g.Members = "auto"
		}
		if g.LeaseTTL == 0 {
			g.LeaseTTL = DefaultGroupLeaseTTL
		}
		if g.Replicas == 0 {
			g.Replicas = 1
		}
	}
	if j.Output.Delivery == "" {
		j.Output.Delivery = "exactly_once"
	}
	if j.DeadLetter.Subject == "" {
		j.DeadLetter.Subject = "cairn.dlq." + j.Name
	}
	if j.DeadLetter.Stream == "" {
		j.DeadLetter.Stream = "CAIRN_DLQ_" + strings.ToUpper(j.Name)
	}
	if c := j.Checkpoint; c != nil {
		if c.Interval == 0 {
			c.Interval = 10 * time.Second
		}
		if c.Mode == "" {
			c.Mode = "incremental"
		}
		if c.Retain == 0 {
			c.Retain = 3
		}
		if c.OrphanGrace == 0 {
			c.OrphanGrace = time.Hour
		}
	}
}

var (
	nameRe    = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	sha256Re  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	subjectRe = regexp.MustCompile(`^[^\s.*>]+(\.[^\s.*>]+)*$`)
	filterRe  = regexp.MustCompile(`^([^\s.*>]+|\*)(\.([^\s.*>]+|\*))*(\.>)?$|^>$`)
)

// Validate checks every field; the first problem is returned as an *Error.
func (j *Job) Validate() error {
	bad := func(field, format string, a ...any) error {
		return &Error{Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	if !nameRe.MatchString(j.Name) {
		return bad("name", "%q must be 1-64 letters, digits, '-' or '_'", j.Name)
	}
	if j.NATS != "embedded" {
		u, err := url.Parse(j.NATS)
		if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" {
			return bad("nats", "%q must be \"embedded\" or a URL like nats://host:4222", j.NATS)
		}
	}
	if len(j.Inputs) > 0 && (j.Input.Stream != "" || len(j.Input.Subjects) > 0 || j.Input.Name != "") {
		return bad("inputs", "a job has input or inputs, not both")
	}
	inField := func(i int) string {
		if len(j.Inputs) == 0 {
			return "input"
		}
		return fmt.Sprintf("inputs[%d]", i)
	}
	inNames := map[string]bool{}
	for i, in := range j.InputsOf() {
		if !nameRe.MatchString(in.Name) {
			return bad(inField(i)+".name", "%q must be 1-64 letters, digits, '-' or '_'", in.Name)
		}
		if inNames[in.Name] {
			return bad(inField(i)+".name", "duplicate input name %q", in.Name)
		}
		inNames[in.Name] = true
		if in.Nexmark != nil {
			if len(j.Inputs) > 0 {
				return bad(inField(i)+".nexmark", "a nexmark input is a job's only input: write it as input: {nexmark: {...}}")
			}
			continue // validateNexmark
		}
		if in.Table != "" {
			if !nameRe.MatchString(in.Table) {
				return bad(inField(i)+".table", "%q must be a KV bucket name (letters, digits, '-', '_')", in.Table)
			}
			if in.Stream != "" || len(in.Subjects) > 0 {
				return bad(inField(i)+".table", "a table input names its KV bucket only (its stream and subjects are the bucket's)")
			}
			continue
		}
		if !nameRe.MatchString(in.Stream) {
			return bad(inField(i)+".stream", "%q must be a stream name (letters, digits, '-', '_')", in.Stream)
		}
		for k, s := range in.Subjects {
			if !filterRe.MatchString(s) {
				return bad(fmt.Sprintf("%s.subjects[%d]", inField(i), k), "%q is not a valid subject filter", s)
			}
		}
	}
	if len(j.Stages) == 0 {
		return bad("stages", "at least one stage is required")
	}
	seen := map[string]bool{}
	for i, s := range j.Stages {
		f := fmt.Sprintf("stages[%d]", i)
		if !nameRe.MatchString(s.Name) {
			return bad(f+".name", "%q must be 1-64 letters, digits, '-' or '_'", s.Name)
		}
		if seen[s.Name] {
			return bad(f+".name", "duplicate stage name %q", s.Name)
		}
		seen[s.Name] = true
	}
	g, err := j.validateGraph()
	if err != nil {
		return err
	}
	if err := j.validateNexmark(j.cut(g)); err != nil {
		return err
	}
	feedsRepartition := map[string]bool{} // stages whose outputs go into a repartition stream
	subs := j.cut(g)
	for _, sub := range subs {
		if sub.Repartitions() {
			for _, s := range sub.Stages {
				feedsRepartition[s.Name] = true
			}
			if len(sub.Targets) > 1 && j.Output.Delivery != "exactly_once" {
				for _, t := range sub.Targets {
					if t.Feeds < 0 {
						return bad("output.delivery", "%s: stage %q feeds both another stage (a repartition stream, written exactly_once) and an output: use delivery exactly_once", j.Output.Delivery, sub.Stages[len(sub.Stages)-1].Name)
					}
				}
			}
		}
		if len(sub.Targets) > 1 && j.Output.Delivery != "exactly_once" && j.Output.Delivery != "core" {
			return bad("output.delivery", "%s: stage %q feeds several outputs; each gets its own exactly-once indexes: use delivery exactly_once (or core)", j.Output.Delivery, sub.Stages[len(sub.Stages)-1].Name)
		}
	}
	for i, s := range j.Stages {
		f := fmt.Sprintf("stages[%d]", i)
		if s.Module == "" {
			return bad(f+".module", "required (builtin:NAME, native:NAME or a path to a .wasm file)")
		}
		if s.TTL < 0 {
			return bad(f+".ttl", "must not be negative")
		}
		if s.TTL > 0 && !s.Keyed {
			return bad(f+".ttl", "only a keyed stage has state with a TTL")
		}
		if s.Slots != 0 {
			if !s.Keyed {
				return bad(f+".slots", "only a keyed stage has slots (its sub-topology's)")
			}
			if err := state.ValidateSlots(s.Slots, j.KeyGroups); err != nil {
				return bad(f+".slots", "%d must be in [1, key_groups=%d]", s.Slots, j.KeyGroups)
			}
		}
		if s.Memory != "" {
			if _, err := ParseBytes(s.Memory); err != nil {
				return bad(f+".memory", "%v", err)
			}
		}
		if s.Config != nil {
			if _, err := json.Marshal(s.Config); err != nil {
				return bad(f+".config", "cannot be expressed as JSON: %v", err)
			}
		}
		if s.SHA256 != "" {
			if strings.HasPrefix(s.Module, "native:") {
				return bad(f+".sha256", "stage %q runs a native operator, which has no module bytes to pin", s.Name)
			}
			if !sha256Re.MatchString(s.SHA256) {
				return bad(f+".sha256", "%q must be 64 lower-case hex digits (sha256sum of the .wasm file)", s.SHA256)
			}
		}
		switch s.Clock {
		case ClockIngestion:
		case ClockWall:
			// INVARIANT: mirrors engine.Config.validate, which refuses the
			// same; here the error names the job-file field. A stage before
			// a repartition stream (written exactly_once) counts as exactly_once.
			d := j.Output.Delivery
			if feedsRepartition[s.Name] {
				d = "exactly_once" // it feeds a repartition stream
			}
			if d == "exactly_once" || d == "dedupe" {
				return bad(f+".clock", "stage %q runs on the wall clock, which a replay after a restore does not repeat, so delivery %s could skip or duplicate the wrong outputs: use delivery transactional, or drop clock: wall so the stage runs on ingestion time", s.Name, d)
			}
		default:
			return bad(f+".clock", "%q must be ingestion (default) or wall", s.Clock)
		}
	}
	if (j.Output.Subject != "" || len(j.Outputs) == 0) && !subjectRe.MatchString(j.Output.Subject) {
		return bad("output.subject", "%q must be a subject without wildcards (outputs go to <subject>.<key group>)", j.Output.Subject)
	}
	switch j.Output.Delivery {
	case "exactly_once", "dedupe", "transactional":
		if j.Output.Delivery == "transactional" && j.Checkpoint == nil {
			return bad("output.delivery", "transactional publishes outputs when a checkpoint commits: add a checkpoint section")
		}
		if j.Output.Subject != "" && !nameRe.MatchString(j.Output.Stream) {
			return bad("output.stream", "%q must be a stream name; delivery %s publishes to JetStream", j.Output.Stream, j.Output.Delivery)
		}
	case "core":
	default:
		return bad("output.delivery", "%q must be exactly_once, dedupe, transactional or core", j.Output.Delivery)
	}
	if p := j.Output.Publish; p != "auto" && p != "async" && p != "batch" {
		return bad("output.publish", "%q must be auto, async or batch", p)
	}
	switch j.Output.Emit {
	case "", "all":
	case "latest":
		// INVARIANT: mirrors engine.Config.validate; here the error names
		// the job-file field and the graph case.
		if j.Output.Delivery != "transactional" {
			return bad("output.emit", "latest keeps only each key's last output of a checkpoint interval, which is sound only where outputs wait for the checkpoint that seals them; delivery %s publishes each output before any checkpoint, so a replay after a crash could not regenerate the same coalesced set: use delivery transactional", j.Output.Delivery)
		}
		if len(subs) > 1 {
			return bad("output.emit", "this job is a graph of %d sub-topologies; the repartition streams between them are written exactly_once, where every update must reach the next stage as a replay regenerates it, so none can be coalesced, and coalescing only the last sub-topology's output is not supported: drop emit: latest", len(subs))
		}
	default:
		return bad("output.emit", "%q must be all or latest", j.Output.Emit)
	}
	if !subjectRe.MatchString(j.DeadLetter.Subject) {
		return bad("dead_letter.subject", "%q must be a subject without wildcards", j.DeadLetter.Subject)
	}
	if !nameRe.MatchString(j.DeadLetter.Stream) {
		return bad("dead_letter.stream", "%q must be a stream name", j.DeadLetter.Stream)
	}
	if err := j.NATSAuth.validate(); err != nil {
		return err
	}
	if j.Savepoints.Retain < 0 {
		return bad("savepoints.retain", "%d must not be negative (0 keeps every savepoint)", j.Savepoints.Retain)
	}
	if err := state.ValidateKeyGroups(j.KeyGroups); err != nil {
		return bad("key_groups", "%d must be in [1, %d]", j.KeyGroups, state.MaxKeyGroups)
	}
	if err := state.ValidateSlots(j.Slots, j.KeyGroups); err != nil {
		return bad("slots", "%d must be in [1, key_groups=%d]", j.Slots, j.KeyGroups)
	}
	if j.Watermark.MaxOutOfOrderness < 0 {
		return bad("watermark.max_out_of_orderness", "must not be negative")
	}
	if j.Watermark.AllowedLateness < 0 {
		return bad("watermark.allowed_lateness", "%v must not be negative (0, the default, dead-letters every late event)", j.Watermark.AllowedLateness)
	}
	if j.BatchSize < 0 || j.BatchSize > 65536 {
		return bad("batch_size", "%d must be in [1, 65536]", j.BatchSize)
	}
	if j.MaxMessage < 0 {
		return bad("max_message_bytes", "must not be negative")
	}
	if j.MaxKeyBytes < 1 || j.MaxKeyBytes > MaxKeyBytesLimit {
		return bad("max_key_bytes", "%d must be in [1, %d]: keys travel in the Cairn-Key header, which the server bounds at 64 KiB", j.MaxKeyBytes, MaxKeyBytesLimit)
	}
	if s := j.Watermark.MaxFutureSkew; s != nil && !s.Off && s.Duration <= 0 {
		return bad("watermark.max_future_skew", "%v must be positive (like 5m), or off", s.Duration)
	}
	if g := j.Group; g != nil {
		if g.Members != "auto" {
			return bad("group.members", "%q must be auto (any number of processes may join)", g.Members)
		}
		if g.LeaseTTL < time.Second {
			return bad("group.lease_ttl", "%v is below the minimum of 1s", g.LeaseTTL)
		}
		if g.Replicas != 1 && g.Replicas != 3 && g.Replicas != 5 {
			return bad("group.replicas", "%d must be 1, 3 or 5", g.Replicas)
		}
		if j.NATS == "embedded" {
			return bad("group", "a group's members share one NATS server or cluster: set nats to its URL, not embedded")
		}
		if j.Checkpoint == nil || j.Checkpoint.Store == "" {
			return bad("group", "a group's members hand sub-topologies over through the checkpoint store: set checkpoint.store to a path or bucket they all reach")
		}
	}
	if f := j.Restore.Fallback; f != "none" && f != "previous" {
		return bad("restore.fallback", "%q must be none or previous", f)
	}
	if m := j.Memory; m != "" {
		if n, err := ParseBytes(m); err != nil || n < MinMemory {
			return bad("memory", "%q must be a size of at least %d MiB, like 256MiB", m, MinMemory>>20)
		}
	}
	if m := j.Restore.Mode; m != "download" && m != "online" {
		return bad("restore.mode", "%q must be download or online", m)
	}
	if p := j.Restore.Prefetch; p != "auto" && p != "on" && p != "off" {
		return bad("restore.prefetch", "%q must be auto, on or off", p)
	}
	if r := j.Restore.DownloadRate; r != "" {
		if n, err := ParseBytes(r); err != nil || n <= 0 {
			return bad("restore.download_rate", "%q must be a positive byte count per second, like 50MiB", r)
		}
	}
	if c := j.Checkpoint; c != nil {
		if c.Store != "" && !strings.HasPrefix(c.Store, "file://") && !strings.HasPrefix(c.Store, "s3://") {
			return bad("checkpoint.store", "%q must be a file:///path or s3://bucket/prefix URL", c.Store)
		}
		if c.Interval < 100*time.Millisecond {
			return bad("checkpoint.interval", "%v is below the minimum of 100ms", c.Interval)
		}
		if c.Mode != "incremental" && c.Mode != "full" {
			return bad("checkpoint.mode", "%q must be incremental or full", c.Mode)
		}
		if c.Retain < 1 {
			return bad("checkpoint.retain", "%d must be at least 1", c.Retain)
		}
		if c.FullEvery < 0 {
			return bad("checkpoint.full_every", "must not be negative")
		}
		if c.RestoreBudget < 0 {
			return bad("checkpoint.restore_budget", "%v must not be negative (0: no budget)", c.RestoreBudget)
		}
		if c.OrphanGrace < 0 {
			return bad("checkpoint.orphan_grace", "must not be negative")
		}
		if r := c.ScrubRate; r != "" && r != "off" {
			if n, err := ParseBytes(r); err != nil || n <= 0 {
				return bad("checkpoint.scrub_rate", "%q must be a rate like 2MiB (bytes per second) or off", r)
			}
		}
		if c.ScrubEvery < 0 {
			return bad("checkpoint.scrub_every", "must not be negative")
		}
	}
	return nil
}

// validate refuses credentials that contradict each other: one way to
// authenticate (creds_file, nkey_file, user, or token), a secret given once
// (inline or from a file), a client certificate with its key. The
// messages name fields, never values.
func (a NATSAuth) validate() error {
	bad := func(field, reason string) error { return &Error{Field: "nats_auth." + field, Reason: reason} }
	var ways []string
	for _, w := range []struct{ name, v string }{{"creds_file", a.CredsFile}, {"nkey_file", a.NKeyFile}, {"user", a.User}, {"token", a.Token + a.TokenFile}} {
		if w.v != "" {
			ways = append(ways, w.name)
		}
	}
	switch {
	case len(ways) > 1:
		return bad(ways[1], fmt.Sprintf("give one way to authenticate, not %s: the server would pick one silently", strings.Join(ways, " and ")))
	case a.Password != "" && a.PasswordFile != "":
		return bad("password_file", "give the password once: password or password_file")
	case (a.Password != "" || a.PasswordFile != "") && a.User == "":
		return bad("user", "a password needs a user")
	case a.Token != "" && a.TokenFile != "":
		return bad("token_file", "give the token once: token or token_file")
	case (a.TLSCert == "") != (a.TLSKey == ""):
		return bad("tls_key", "a client certificate needs both tls_cert and tls_key")
	}
	return nil
}

// ConfigJSON is the stage's config as JSON ("" when none).
func (s *Stage) ConfigJSON() []byte {
	if s.Config == nil {
		return nil
	}
	b, _ := json.Marshal(normalize(s.Config))
	return b
}

// normalize turns YAML's map[string]any trees into JSON-encodable values.
func normalize(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			t[k] = normalize(x)
		}
	case []any:
		for i, x := range t {
			t[i] = normalize(x)
		}
	}
	return v
}

// ParseBytes parses sizes like 256MiB, 1GiB, 4096.
func ParseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size like 256MiB", s)
	}
	return n * mult, nil
}

// validateNexmark checks a generated input and a discard output of a job
// cut into subs. In a job graph the generated input feeds the
// sub-topology that reads the job's input, and the discard output ends the
// one that writes the job's output; that one must write nothing else, as a
// discarding broker would discard its repartition outputs too.
func (j *Job) validateNexmark(subs []SubTopology) error {
	bad := func(field, format string, a ...any) error {
		return &Error{Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	if nx := j.Input.Nexmark; nx != nil {
		if j.Input.Stream != NexmarkStream || len(j.Input.Subjects) > 0 || j.Input.Table != "" {
			return bad("input.nexmark", "a nexmark input is generated in process: leave out input.stream, input.subjects and input.table")
		}
		if err := nx.Validate(); err != nil {
			return bad("input.nexmark", "%v", err)
		}
	}
	if j.Output.Discard {
		if j.Output.Stream != "" || len(j.Outputs) > 0 {
			return bad("output.discard", "a discard output publishes nothing: leave out output.stream and outputs")
		}
		if j.Output.Delivery != "core" {
			return bad("output.delivery", "%s: a discard output publishes nothing: leave out delivery", j.Output.Delivery)
		}
		for _, sub := range subs {
			if len(sub.Targets) > 1 && slices.ContainsFunc(sub.Targets, func(t Target) bool { return t.Feeds < 0 }) {
				return bad("output.discard", "sub-topology %d writes the discard output and %d other targets; a discard output must be its sub-topology's only target", sub.Index, len(sub.Targets)-1)
			}
		}
	}
	return nil
}
