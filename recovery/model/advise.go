package model

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The mode advisor: from measured numbers only, whether
// incremental checkpoints buy anything for a job. It compares the two
// modes' checkpoint costs (the p50 of the retained checkpoints of each
// mode: duration from barrier to commit, sync part, bytes uploaded) and
// their restores from the store (the model's prediction for the newest
// checkpoint of each mode), and recommends one. Advise is pure: the CLI
// (`cairn checkpoints advise`) and the dashboard's observer gather the
// checkpoints and the predictions and print its Text.

// Recommendations of Advise.
const (
	RecommendIncremental = "incremental"
	RecommendFull        = "full"
	// RecommendEither: neither mode costs measurably less to take or to
	// restore.
	RecommendEither = "either"
	// RecommendUnknown: a mode, or a restore term, has not been measured;
	// Advice.Missing says what and how to measure it.
	RecommendUnknown = "unknown"
)

// Thresholds of the decision.
const (
	// AdviseMinRelative: a difference between the two modes (checkpoint
	// duration, predicted restore) counts only when it is at least 20% of
	// the larger of the two values...
	AdviseMinRelative = 0.20
	// AdviseMinSeconds: ...and at least 50 ms: below that it is the noise
	// of single measurements (one slow fsync, a GC pause), not a cost
	// anyone waits for.
	AdviseMinSeconds = 0.050
	// AdviseIntervalShare: in a trade-off (one mode cheaper to take, the
	// other faster to restore), the mode that restores faster is
	// recommended unless its checkpoints take at least half the
	// checkpoint interval: then they would not keep up with the interval
	// (a checkpoint waits for the previous one's upload) and the cheaper
	// mode is recommended.
	AdviseIntervalShare = 0.5
	// adviseOldFull: a full checkpoint that is not retained (a savepoint,
	// or one the dashboard remembers) taken this long before the newest
	// incremental one is said to be old: the state may have changed since.
	// (The two modes' state sizes are not compared: the full format is
	// compressed key-value pairs, the incremental one Pebble's files with
	// what compactions have not merged yet.)
	adviseOldFull = 10 * time.Minute
)

// AdviseCheckpoint is one measured checkpoint (or savepoint): its
// manifest's figures and the model's prediction of its restore.
type AdviseCheckpoint struct {
	ID uint64
	// Mode is Incremental or Full.
	Mode string
	// Savepoint names a savepoint (a full checkpoint that retention keeps);
	// "" for a checkpoint.
	Savepoint string
	Time      time.Time
	// Sync is the slowest slot's synchronous part, Async the upload and
	// commit.
	Sync, Async   time.Duration
	BytesUploaded int64
	FullStateSize int64
	ChainLength   int
	// Restore is Model.Predict of its restore from the store onto its own
	// slots (recovery.StoreInput): the number `checkpoints ls` prints.
	Restore Prediction
	// Gone marks a checkpoint no longer retained (the dashboard remembers
	// the newest of each mode it has seen): it is used only when the
	// retained ones lack its mode.
	Gone bool
}

func (c AdviseCheckpoint) took() time.Duration { return c.Sync + c.Async }

// AdviseInput is what Advise decides from.
type AdviseInput struct {
	// Checkpoints are the retained checkpoints, and savepoints, oldest
	// first, with a prediction each.
	Checkpoints []AdviseCheckpoint
	// Interval is the job's checkpoint.interval (0: unknown, then the
	// median spacing of the checkpoints is used).
	Interval time.Duration
	// Budget is checkpoint.restore_budget (0: none). In a trade-off the
	// mode that is cheaper to take is recommended when its restore is
	// within the budget.
	Budget time.Duration
	// Mode, FullEvery and Retain are the job's checkpoint.mode,
	// checkpoint.full_every and checkpoint.retain, for the advice on how to
	// measure a missing mode (zero: unknown).
	Mode      string
	FullEvery int
	Retain    int
}

// ModeFigures are one mode's measured costs.
type ModeFigures struct {
	Mode string
	// N is the number of checkpoints the p50s are over.
	N int
	// Newest is the newest checkpoint of the mode (its id, or its
	// savepoint's name).
	Newest    uint64
	Savepoint string
	Time      time.Time
	// Gone: the newest is no longer retained (remembered by the
	// dashboard).
	Gone bool
	// Took, Sync and Uploaded are p50s (the lower median: a measured value,
	// never an interpolation) over the N checkpoints.
	Took     time.Duration
	Sync     time.Duration
	Uploaded int64
	// State and Chain are the newest's full state size and chain length.
	State int64
	Chain int
	// Restore is the newest's predicted restore from the store.
	Restore Prediction
}

// Advice is the advisor's answer.
type Advice struct {
	// Recommend is RecommendIncremental, RecommendFull, RecommendEither or
	// RecommendUnknown.
	Recommend string
	// Text says it with the numbers it rests on, for people.
	Text string
	// Reason is the rule that decided (a part of Text).
	Reason string
	// Incremental and Full are the modes' figures (nil: not measured).
	Incremental, Full *ModeFigures
	// Missing says what is not measured and how to measure it (empty when
	// nothing is).
	Missing []string
	// Saves is Full.Took - Incremental.Took (what an incremental checkpoint
	// saves; negative: what it costs more), SavesBytes the same for the
	// bytes uploaded. Set when both modes are measured.
	Saves      time.Duration
	SavesBytes int64
	// AddsToRestore is Incremental.Restore - Full.Restore (negative: an
	// incremental restore is faster); RestoreKnown is false while either
	// prediction is calibrating.
	AddsToRestore time.Duration
	RestoreKnown  bool
	// Interval is the checkpoint interval used ("" rule: configured, else
	// measured spacing; 0 unknown).
	Interval time.Duration
}

// Advise decides whether incremental checkpoints buy anything, from
// measured numbers only: a mode never measured, or a restore term never
// calibrated, makes the answer RecommendUnknown with what is missing and
// how to measure it — never a guess.
//
// The rules, with both modes measured and both restores predicted:
//
//   - checkpoint cost: the p50 duration (sync + async) of each mode; the
//     restore: the predicted restore from the store of each mode's newest
//     checkpoint. A difference counts when it is at least AdviseMinRelative
//     of the larger value and AdviseMinSeconds.
//   - no difference counts: RecommendEither.
//   - one mode is cheaper to take, faster to restore, or both, and worse at
//     neither: that mode.
//   - a trade-off (one cheaper to take, the other faster to restore): with
//     a restore budget, the cheaper mode when its restore is within the
//     budget, else the faster-restoring one; without a budget, the
//     faster-restoring mode, unless its checkpoints take at least
//     AdviseIntervalShare of the interval (they would not keep up); with no
//     interval known, RecommendEither, saying what is traded.
func Advise(in AdviseInput) Advice {
	var a Advice
	a.Interval = in.Interval
	if a.Interval <= 0 {
		a.Interval = medianSpacing(in.Checkpoints)
	}
	a.Incremental = modeFigures(in.Checkpoints, Incremental)
	a.Full = modeFigures(in.Checkpoints, Full)
	inc, full := a.Incremental, a.Full

	// The state: Pebble's files as the newest incremental checkpoint
	// references them, and the full format's compressed pairs.
	var head []string
	switch {
	case inc != nil && full != nil:
		head = append(head, fmt.Sprintf("state %s (%s as a full checkpoint)", Bytes(inc.State), Bytes(full.State)))
	case inc != nil:
		head = append(head, "state "+Bytes(inc.State))
	case full != nil:
		head = append(head, "state "+Bytes(full.State)+" as a full checkpoint")
	}
	switch {
	case inc == nil && full == nil:
		a.Recommend = RecommendUnknown
		a.Missing = append(a.Missing, "no committed checkpoint to measure: run the job with checkpoints (the advice compares one of each mode)")
		a.Text = strings.Join(a.Missing, "; ")
		return a
	case inc == nil || full == nil:
		have, lack := inc, Full
		if have == nil {
			have, lack = full, Incremental
		}
		a.Recommend = RecommendUnknown
		a.Missing = append(a.Missing, howToMeasureMode(lack, in))
		a.Missing = append(a.Missing, howToCalibrate(have.Restore)...)
		a.Text = sentence(head, describeMode(have)) + " " + capitalize(a.Missing[0]) + "."
		if len(a.Missing) > 1 {
			a.Text += " The restore model is calibrating: " + strings.Join(a.Missing[1:], "; ") + "."
		}
		return a
	}

	a.Saves = full.Took - inc.Took
	a.SavesBytes = full.Uploaded - inc.Uploaded
	a.RestoreKnown = inc.Restore.OK && full.Restore.OK
	if a.RestoreKnown {
		a.AddsToRestore = time.Duration((inc.Restore.Seconds - full.Restore.Seconds) * float64(time.Second))
	}
	// A full checkpoint that is not retained (a savepoint, or one the
	// dashboard remembers) may be old: say how old.
	skew := ""
	if age := inc.Time.Sub(full.Time); (full.Savepoint != "" || full.Gone) && age >= adviseOldFull {
		skew = fmt.Sprintf(" The full one was taken %s before the newest incremental one: a new full checkpoint compares like with like.", age.Round(time.Second))
	}

	if !a.RestoreKnown {
		a.Recommend = RecommendUnknown
		for _, f := range []*ModeFigures{full, inc} {
			for _, m := range howToCalibrate(f.Restore) {
				if !slices.Contains(a.Missing, m) {
					a.Missing = append(a.Missing, m)
				}
			}
		}
		a.Text = sentence(head, fmt.Sprintf("%s takes %s (uploads %s); incremental %s", fullLabel(full), Seconds(full.Took.Seconds()),
			Bytes(full.Uploaded), savesPhrase(a.Saves, a.SavesBytes))) + skew +
			" Whether incremental adds to a restore is not known yet; the restore model is calibrating: " + strings.Join(a.Missing, "; ") + "."
		return a
	}

	// +1: incremental checkpoints are cheaper to take; -1: dearer.
	ck := differs(full.Took.Seconds(), inc.Took.Seconds())
	// +1: an incremental restore is slower; -1: faster.
	rs := differs(inc.Restore.Seconds, full.Restore.Seconds)
	a.Recommend, a.Reason = decide(ck, rs, inc, full, a.Interval, in.Budget)

	bw := ""
	if t := inc.Restore.Terms[TermBandwidth]; t.Known() && inc.Restore.In.BytesFetch > 0 {
		bw = " at " + Bytes(int64(t.Value)) + "/s"
	}
	chain := ""
	if inc.Chain > 1 {
		chain = fmt.Sprintf(" (chain of %d)", inc.Chain)
	}
	body := fmt.Sprintf("%s takes %s (uploads %s) and restores in %s; incremental %s and %s%s%s",
		fullLabel(full), Seconds(full.Took.Seconds()), Bytes(full.Uploaded), Seconds(full.Restore.Seconds),
		savesPhrase(a.Saves, a.SavesBytes), restorePhrase(a.AddsToRestore), bw, chain)
	a.Text = sentence(head, body) + skew + " Recommended: " + a.Recommend + " — " + a.Reason + "."
	return a
}

// decide applies the rules of Advise to the signs of the differences.
func decide(ck, rs int, inc, full *ModeFigures, interval, budget time.Duration) (string, string) {
	switch {
	case ck == 0 && rs == 0:
		return RecommendEither, fmt.Sprintf("neither mode is measurably cheaper to take or faster to restore (differences under %.0f%% or %s)",
			AdviseMinRelative*100, Seconds(AdviseMinSeconds))
	case ck >= 0 && rs <= 0:
		if ck > 0 && rs < 0 {
			return RecommendIncremental, "incremental checkpoints cost less and restore faster"
		} else if ck > 0 {
			return RecommendIncremental, "incremental checkpoints cost less and restore no slower"
		}
		return RecommendIncremental, "incremental checkpoints restore faster and cost no more"
	case ck <= 0 && rs >= 0:
		if ck < 0 && rs > 0 {
			return RecommendFull, "full checkpoints cost less and restore faster"
		} else if ck < 0 {
			return RecommendFull, "full checkpoints cost less and restore no slower"
		}
		return RecommendFull, "full checkpoints restore faster and cost no more"
	}
	// A trade-off: cheap is the mode cheaper to take, fast the one faster
	// to restore.
	cheap, fast := inc, full
	if ck < 0 {
		cheap, fast = full, inc
	}
	if budget > 0 {
		if cheap.Restore.Seconds <= budget.Seconds() {
			return cheap.Mode, fmt.Sprintf("%s checkpoints cost less, and their restore (%s) is within checkpoint.restore_budget %s",
				cheap.Mode, Seconds(cheap.Restore.Seconds), budget)
		}
		return fast.Mode, fmt.Sprintf("%s restore (%s) exceeds checkpoint.restore_budget %s; a %s one takes %s", article(cheap.Mode),
			Seconds(cheap.Restore.Seconds), budget, fast.Mode, Seconds(fast.Restore.Seconds))
	}
	if interval <= 0 {
		return RecommendEither, fmt.Sprintf("a trade-off: %s checkpoints cost less, %s ones restore faster (set checkpoint.restore_budget to decide it)", cheap.Mode, fast.Mode)
	}
	if fast.Took.Seconds() >= AdviseIntervalShare*interval.Seconds() {
		return cheap.Mode, fmt.Sprintf("%s checkpoints restore faster, but take %s, %.0f%% or more of the %s interval: they would not keep up",
			fast.Mode, Seconds(fast.Took.Seconds()), AdviseIntervalShare*100, interval)
	}
	return fast.Mode, fmt.Sprintf("a restore is what you wait for, and %s checkpoints fit the %s interval (%s each); what %s ones save is upload time in the background",
		fast.Mode, interval, Seconds(fast.Took.Seconds()), cheap.Mode)
}

// differs compares a and b: +1 when a is larger by a difference that
// counts (AdviseMinRelative of the larger and AdviseMinSeconds), -1 when b
// is, 0 otherwise.
func differs(a, b float64) int {
	d := a - b
	if abs(d) < AdviseMinSeconds || abs(d) < AdviseMinRelative*max(abs(a), abs(b)) {
		return 0
	}
	if d > 0 {
		return 1
	}
	return -1
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// modeFigures returns the figures of a mode: the p50s over its retained
// checkpoints; when it has none, the newest of its savepoints (full) and
// the ones no longer retained (Gone); nil when there is none at all.
func modeFigures(cks []AdviseCheckpoint, mode string) *ModeFigures {
	var pick []AdviseCheckpoint
	for _, c := range cks {
		if c.Mode == mode && c.Savepoint == "" && !c.Gone {
			pick = append(pick, c)
		}
	}
	if len(pick) == 0 {
		// None retained: the newest savepoint or remembered one.
		var newest *AdviseCheckpoint
		for i := range cks {
			if c := &cks[i]; c.Mode == mode && (newest == nil || !c.Time.Before(newest.Time)) {
				newest = c
			}
		}
		if newest != nil {
			pick = append(pick, *newest)
		}
	}
	if len(pick) == 0 {
		return nil
	}
	n := pick[len(pick)-1]
	for _, c := range pick {
		if c.Time.After(n.Time) {
			n = c
		}
	}
	f := &ModeFigures{Mode: mode, N: len(pick), Newest: n.ID, Savepoint: n.Savepoint, Time: n.Time, Gone: n.Gone, State: n.FullStateSize, Chain: n.ChainLength, Restore: n.Restore}
	f.Took = p50(pick, func(c AdviseCheckpoint) time.Duration { return c.took() })
	f.Sync = p50(pick, func(c AdviseCheckpoint) time.Duration { return c.Sync })
	f.Uploaded = p50(pick, func(c AdviseCheckpoint) int64 { return c.BytesUploaded })
	return f
}

// p50 is the lower median of v over cs: one of the measured values.
func p50[T int64 | time.Duration](cs []AdviseCheckpoint, v func(AdviseCheckpoint) T) T {
	xs := make([]T, len(cs))
	for i, c := range cs {
		xs[i] = v(c)
	}
	slices.Sort(xs)
	return xs[(len(xs)-1)/2]
}

// medianSpacing is the lower median of the time between consecutive
// retained checkpoints (0 with fewer than two).
func medianSpacing(cks []AdviseCheckpoint) time.Duration {
	var ts []time.Time
	for _, c := range cks {
		if c.Savepoint == "" && !c.Gone && !c.Time.IsZero() {
			ts = append(ts, c.Time)
		}
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	var ds []time.Duration
	for i := 1; i < len(ts); i++ {
		if d := ts[i].Sub(ts[i-1]); d > 0 {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[(len(ds)-1)/2]
}

func newestName(f *ModeFigures) string {
	if f.Savepoint != "" {
		return fmt.Sprintf("%d (savepoint %s)", f.Newest, f.Savepoint)
	}
	if f.Gone {
		return fmt.Sprintf("%d (no longer retained)", f.Newest)
	}
	return fmt.Sprintf("%d", f.Newest)
}

// fullLabel names the full checkpoint the comparison uses, when it is not
// simply a retained one.
func fullLabel(f *ModeFigures) string {
	switch {
	case f.Savepoint != "":
		return "a full checkpoint (savepoint " + f.Savepoint + ")"
	case f.Gone:
		return fmt.Sprintf("a full checkpoint (#%d, no longer retained)", f.Newest)
	}
	return "a full checkpoint"
}

func article(mode string) string {
	if mode == Incremental {
		return "an " + mode
	}
	return "a " + mode
}

// describeMode says one mode's measured costs.
func describeMode(f *ModeFigures) string {
	kind := "an incremental checkpoint"
	if f.Mode == Full {
		kind = "a full checkpoint"
	}
	s := fmt.Sprintf("%s takes %s (uploads %s; p50 of %d, newest #%s)", kind, Seconds(f.Took.Seconds()), Bytes(f.Uploaded), f.N, newestName(f))
	if f.Restore.OK {
		return s + " and restores from the store in " + Seconds(f.Restore.Seconds)
	}
	return s + "; its restore is " + f.Restore.Short()
}

func savesPhrase(saves time.Duration, bytes int64) string {
	s := "saves " + Seconds(saves.Seconds()) + " per checkpoint"
	if saves < 0 {
		s = "costs " + Seconds(-saves.Seconds()) + " more per checkpoint"
	}
	if bytes >= 0 {
		return s + " (uploads " + Bytes(bytes) + " less)"
	}
	return s + " (uploads " + Bytes(-bytes) + " more)"
}

func restorePhrase(adds time.Duration) string {
	if adds < 0 {
		return "takes " + Seconds(-adds.Seconds()) + " off a restore"
	}
	return "adds " + Seconds(adds.Seconds()) + " to a restore"
}

// howToMeasureMode says that a mode was never measured and how to measure
// it.
func howToMeasureMode(mode string, in AdviseInput) string {
	if mode == Full {
		s := "no full checkpoint or savepoint to compare with: take one with " +
			"curl -X POST 'http://ADDR/api/action/checkpoint?mode=full' (the job's --http address; add -H 'Authorization: Bearer TOKEN' with a token), " +
			"or a savepoint (cairn savepoint --http ADDR --name NAME: a full checkpoint that retention keeps)"
		if in.FullEvery > 0 {
			retain := ""
			if in.Retain > 0 {
				retain = fmt.Sprintf(", and checkpoint.retain: %d drops it once %d newer ones commit", in.Retain, in.Retain)
			}
			return s + fmt.Sprintf("; checkpoint.full_every: %d makes one after every %d incremental ones%s", in.FullEvery, in.FullEvery, retain)
		}
		return s + ", or set checkpoint.full_every: N (one full checkpoint after every N incremental ones)"
	}
	s := "no incremental checkpoint to compare with: take some with " +
		"curl -X POST 'http://ADDR/api/action/checkpoint?mode=incremental' (the job's --http address; two or more: the first after a full one uploads the whole state)"
	if in.Mode != Incremental {
		s += ", or set checkpoint.mode: incremental (with checkpoint.full_every: N to keep taking full ones)"
	}
	return s
}

// howToCalibrate says what a calibrating prediction lacks and how to
// measure it (nothing for an OK one).
func howToCalibrate(p Prediction) []string {
	if p.OK {
		return nil
	}
	var out []string
	for _, m := range p.Missing {
		s := missingText[m]
		if how := calibrateHow[m]; how != "" {
			s += " (" + how + ")"
		}
		out = append(out, s)
	}
	return out
}

var calibrateHow = map[string]string{
	TermBandwidth: "a checkpoint's upload of 256 KiB or more, or a restore from the store, measures it",
	TermDecode:    "a restore of a full checkpoint measures it; cairn drill does one",
	TermMove:      "a restore onto fewer slots measures it",
}

func sentence(head []string, body string) string {
	if len(head) == 0 {
		return capitalize(body) + "."
	}
	return strings.Join(head, ", ") + ": " + body + "."
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
