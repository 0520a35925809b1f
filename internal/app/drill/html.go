package drill

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"html"
	"strconv"
	"strings"
	"time"
)

// reportPage is drill.html's template: one static page, its CSS inline, no
// script and no request (its Content-Security-Policy forbids both).
//
//go:embed report.html
var reportPage string

// The page's @NAME@ placeholders are filled by render, escaped, with plain
// string building: html/template would link reflection that keeps the
// linker from dropping unused methods (5 MiB more binary, measured).

// htmlView is what report.html shows. Every figure is a string formatted
// here, with the table's functions; 64-bit numbers (checksums, ids, byte
// counts) are never JavaScript numbers.
type htmlView struct {
	Title, Started, Verdict string
	Failed                  bool
	Config                  [][2]string
	Digest                  [][2]string
	Scenarios               []htmlScenario
	Checkpoints             []htmlCheckpoint
	// Data is the report as drill.json has it, every integer a string
	// (JSON with <, > and & escaped: safe inside <script>).
	Data string
}

type htmlScenario struct {
	Name, Source, Slots               string
	Predicted, Measured, Delta, State string
	Calib, Differs                    bool
	Checkpoint, Mode, Chain           string
	ChkP50, ChkMax, Uploaded          string
	Downloaded, Local, Files          string
	RetainedExclusive, RetainedShared string
	Digest, Note                      string
}

type htmlCheckpoint struct {
	ID, Mode, Chain, Time                        string
	Duration, Sync, Async                        string
	Uploaded, FilesUploaded, FilesReused         string
	FullState, RetainedExclusive, RetainedShared string
	PredictedFromStore                           string
}

var sourceText = map[string]string{
	"store":   "from the store",
	"local":   "from the local copy",
	"standby": "from the standby's cache",
}

// HTML renders the report as a page of its own: the verdict, the
// configuration, one row per scenario (predicted, measured and Δ beside the
// checkpoint figures) and the checkpoints taken. The data is inlined; the
// page fetches nothing and runs no script.
func (r *Report) HTML() ([]byte, error) {
	c := r.Config
	v := htmlView{
		Title:   "cairn drill " + r.Started.UTC().Format("2006-01-02 15:04 UTC"),
		Started: r.Started.UTC().Format("2006-01-02 15:04:05 UTC"),
		Verdict: r.Verdict(),
		Config: [][2]string{
			{"state", fmt.Sprintf("%s keys × %d B (target %s; %s on disk at the kill)", u64(c.Keys), c.ValueBytes, fmtBytes(c.StateBytes), fmtBytes(r.JobStateBytes))},
			{"job", fmt.Sprintf("%d slots, key_groups %d, rescaled restores to %d slots", c.Slots, c.KeyGroups, c.RescaleTo)},
			{"checkpoints", fmt.Sprintf("%d incremental (%.2f%% of the keys changed between two), then one full", c.Chain, c.Change*100)},
			{"store", c.Store},
			{"bandwidth", r.limitText()},
			{"measured", fmt.Sprintf("download %s/s (standby sync), upload %s/s", fmtBytes(r.MeasuredBandwidth), fmtBytes(r.UploadBandwidth))},
			{"restore model", r.termsText() + " (the (calib) rows measured open, move and decode)"},
			{"prediction error", r.ErrorSummary()},
			{"standby lag", fmtBytes(r.StandbyLagBytes) + " at the kill"},
		},
		Digest: [][2]string{
			{"entries", u64(r.StateBeforeKill.Entries)},
			{"sum", strconv.FormatUint(r.StateBeforeKill.Sum, 10)},
			{"xor", strconv.FormatUint(r.StateBeforeKill.Xor, 10)},
		},
	}
	if len(r.SubTopologies) > 0 {
		// A graph: what it is, and each sub-topology's chain, state and
		// model (the rows above are the first's).
		v.Config = append(v.Config, [2]string{"job graph", c.Graph})
		for _, st := range r.SubTopologies {
			v.Config = append(v.Config, [2]string{st.Name, fmt.Sprintf("chain %s: %s keys, %s on disk at the kill, state %v; restore model: %s",
				st.Job, u64(st.Keys), fmtBytes(st.JobStateBytes), st.StateBeforeKill, termsText(st.ModelTerms))})
		}
	}
	for _, s := range r.Scenarios {
		src := sourceText[s.Source]
		if src == "" {
			src = s.Source
		}
		v.Failed = v.Failed || !s.StateEqual
		v.Scenarios = append(v.Scenarios, htmlScenario{
			Name: s.Name, Source: src, Slots: slotsText(s),
			Predicted: predictedText(s), Measured: restoreText(s), Delta: deltaText(s), State: stateText(s),
			Calib: s.CalibratesOpenTime != "", Differs: !s.StateEqual,
			Checkpoint: strconv.FormatUint(s.CheckpointID, 10), Mode: s.Mode, Chain: strconv.Itoa(s.ChainLength),
			ChkP50: fmtSec(s.CheckpointP50Seconds), ChkMax: fmtSec(s.CheckpointMaxSeconds), Uploaded: fmtBytes(s.BytesUploaded),
			Downloaded: fmtBytes(s.BytesDownloaded), Local: fmtBytes(s.BytesLocal), Files: strconv.Itoa(s.Files),
			RetainedExclusive: fmtBytes(s.RetainedExclusiveBytes), RetainedShared: fmtBytes(s.RetainedSharedBytes),
			Digest: s.StateDigest, Note: s.Note,
		})
	}
	for _, ck := range r.Checkpoints {
		id := strconv.FormatUint(ck.ID, 10)
		if ck.SubTopology != "" {
			id = ck.SubTopology + " " + id
		}
		v.Checkpoints = append(v.Checkpoints, htmlCheckpoint{
			ID: id, Mode: ck.Mode, Chain: strconv.Itoa(ck.ChainLength), Time: ck.Time.UTC().Format(time.TimeOnly),
			Duration: fmtSec(ck.DurationSeconds), Sync: fmtSec(ck.SyncSeconds), Async: fmtSec(ck.AsyncSeconds),
			Uploaded: fmtBytes(ck.BytesUploaded), FilesUploaded: strconv.Itoa(ck.FilesUploaded), FilesReused: strconv.Itoa(ck.FilesReused),
			FullState: fmtBytes(ck.FullStateBytes), RetainedExclusive: fmtBytes(ck.RetainedExclusiveBytes), RetainedShared: fmtBytes(ck.RetainedSharedBytes),
			PredictedFromStore: r.predictStore(ck).Short(),
		})
	}
	data, err := r.inlineData(v.Verdict)
	if err != nil {
		return nil, err
	}
	v.Data = string(data)
	return []byte(v.render()), nil
}

// render fills report.html's placeholders; every text is HTML-escaped.
func (v *htmlView) render() string {
	e := html.EscapeString
	var sc, cfg, dg, ck strings.Builder
	for _, s := range v.Scenarios {
		fmt.Fprintf(&sc, "\n<tr data-scenario=\"%s\">\n  <td class=\"l name\">%s<small>%s</small>", e(s.Name), e(s.Name), e(s.Source))
		if s.Note != "" {
			fmt.Fprintf(&sc, "<span class=\"note\">%s</span>", e(s.Note))
		}
		calib, title := "", ""
		if s.Calib {
			calib = " calib"
			title = ` title="calibration: this restore measured a term of the restore model (open, move or decode) the later predictions use"`
		}
		state := "ok"
		if s.Differs {
			state = "bad"
		}
		fmt.Fprintf(&sc, "</td>\n  <td class=\"key\" data-col=\"predicted\">%s</td>\n  <td class=\"key\" data-col=\"measured\">%s</td>\n  <td class=\"key%s\" data-col=\"delta\"%s>%s</td>\n",
			e(s.Predicted), e(s.Measured), calib, title, e(s.Delta))
		fmt.Fprintf(&sc, "  <td data-col=\"state\" class=\"%s\" title=\"%s\">%s</td>\n  <td>%s<small>%s, chain %s</small></td>\n  <td>%s</td>\n  <td>%s<small>max %s</small></td>\n  <td>%s</td>\n  <td>%s</td>\n  <td>%s</td>\n  <td>%s</td>\n  <td>%s<small>+ %s shared</small></td>\n</tr>",
			state, e(s.Digest), e(s.State), e(s.Checkpoint), e(s.Mode), e(s.Chain), e(s.Slots), e(s.ChkP50), e(s.ChkMax), e(s.Uploaded), e(s.Downloaded), e(s.Local), e(s.Files), e(s.RetainedExclusive), e(s.RetainedShared))
	}
	for _, kv := range v.Config {
		fmt.Fprintf(&cfg, "\n  <dt>%s</dt><dd>%s</dd>", e(kv[0]), e(kv[1]))
	}
	for _, kv := range v.Digest {
		fmt.Fprintf(&dg, "\n  <dt>%s</dt><dd data-digest=\"%s\">%s</dd>", e(kv[0]), e(kv[0]), e(kv[1]))
	}
	for _, c := range v.Checkpoints {
		fmt.Fprintf(&ck, "\n<tr data-checkpoint=\"%s\">\n  <td>%s</td><td class=\"l\">%s</td><td>%s</td><td>%s</td>\n  <td>%s</td><td>%s</td><td>%s</td>\n  <td>%s</td><td>%s / %s</td><td>%s</td>\n  <td>%s / %s</td><td>%s</td>\n</tr>",
			e(c.ID), e(c.ID), e(c.Mode), e(c.Chain), e(c.Time), e(c.Duration), e(c.Sync), e(c.Async), e(c.Uploaded), e(c.FilesUploaded), e(c.FilesReused), e(c.FullState), e(c.RetainedExclusive), e(c.RetainedShared), e(c.PredictedFromStore))
	}
	failed := ""
	if v.Failed {
		failed = " failed"
	}
	return strings.NewReplacer(
		"@TITLE@", e(v.Title), "@STARTED@", e(v.Started), "@FAILED@", failed, "@VERDICT@", e(v.Verdict),
		"@SCENARIOS@", sc.String(), "@CONFIG@", cfg.String(), "@DIGEST@", dg.String(), "@CHECKPOINTS@", ck.String(),
		"@DATA@", v.Data,
	).Replace(reportPage)
}

func u64[T int | int64 | uint64](n T) string { return fmt.Sprint(n) }

// inlineData is the JSON inlined in the page for a reader that wants the
// figures: {"verdict": …, "report": drill.json}, with every integer a
// decimal string (a JavaScript reader would round a 64-bit one). It is
// safe inside a <script> element: json.Marshal escapes <, > and &.
func (r *Report) inlineData(verdict string) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"verdict": verdict, "report": intsAsStrings(doc)})
}

// intsAsStrings replaces every integer of a decoded JSON document (decoded
// with UseNumber) by its decimal string.
func intsAsStrings(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = intsAsStrings(e)
		}
	case []any:
		for i, e := range x {
			x[i] = intsAsStrings(e)
		}
	case json.Number:
		if !strings.ContainsAny(string(x), ".eE") {
			return string(x)
		}
	}
	return v
}
