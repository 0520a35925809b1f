package drill

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// AccuracyRun is one drill of an accuracy benchmark (BenchmarkDrillAccuracy):
// its report, and a note on the conditions it ran in (the machine's load).
type AccuracyRun struct {
	Report *Report
	Note   string
}

// Label names the drill by what differs between the runs: state size,
// bandwidth limit and slot counts ("64.0MiB at 20 MB/s, 2→1 slots").
func (a AccuracyRun) Label() string {
	c := a.Report.Config
	bw := "unthrottled"
	if c.BandwidthBytesPerSec > 0 {
		bw = fmt.Sprintf("at %.0f MB/s", float64(c.BandwidthBytesPerSec)/1e6)
	}
	return fmt.Sprintf("%s %s, %d→%d slots", fmtBytes(c.StateBytes), bw, c.Slots, c.RescaleTo)
}

// AccuracyGoal is the prediction error every scenario should stay within.
const AccuracyGoal = 0.25

// AccuracyTable prints the error table of several drills as Markdown: one
// row per scenario, one column per drill, each cell "measured / predicted /
// Δ" (the measured time the median of the drill's repeats, its range in
// brackets; "(calib)" for a row that measured a model term), then the
// model's terms per drill and the verdict against AccuracyGoal. It returns
// the worst |Δ| over every predicted scenario (-1: none was predicted).
func AccuracyTable(w io.Writer, runs []AccuracyRun) float64 {
	var names []string
	seen := map[string]bool{}
	for _, a := range runs {
		for _, s := range a.Report.Scenarios {
			if !seen[s.Name] {
				seen[s.Name] = true
				names = append(names, s.Name)
			}
		}
	}
	cols := make([]string, len(runs))
	for i, a := range runs {
		cols[i] = a.Label()
		if a.Note != "" {
			cols[i] += " (" + a.Note + ")"
		}
	}
	fmt.Fprintf(w, "| scenario | %s |\n", strings.Join(cols, " | "))
	fmt.Fprintf(w, "|---|%s\n", strings.Repeat("---|", len(runs)))
	worst := -1.0
	var outside []string
	for _, name := range names {
		cells := make([]string, len(runs))
		for i, a := range runs {
			s, ok := findScenario(a.Report, name)
			if !ok {
				cells[i] = "—"
				continue
			}
			cells[i] = accuracyCell(s)
			if predicted(s) {
				e := math.Abs(s.PredictionError)
				worst = max(worst, e)
				if e > AccuracyGoal {
					outside = append(outside, fmt.Sprintf("%s in %s (%+.0f%%)", name, a.Label(), s.PredictionError*100))
				}
			}
		}
		fmt.Fprintf(w, "| %s | %s |\n", name, strings.Join(cells, " | "))
	}
	terms := make([]string, len(runs))
	worsts := make([]string, len(runs))
	for i, a := range runs {
		terms[i] = a.Report.termsText()
		worsts[i] = "—"
		if e := worstError(a.Report); e >= 0 {
			worsts[i] = fmt.Sprintf("%.0f%%", e*100)
		}
	}
	fmt.Fprintf(w, "| model terms (end of drill) | %s |\n", strings.Join(terms, " | "))
	fmt.Fprintf(w, "| worst \\|Δ\\| | %s |\n", strings.Join(worsts, " | "))
	fmt.Fprintln(w)
	switch {
	case worst < 0:
		fmt.Fprintln(w, "no scenario was predicted")
	case len(outside) == 0:
		fmt.Fprintf(w, "every predicted scenario within ±%.0f%%: worst %.0f%%\n", AccuracyGoal*100, worst*100)
	default:
		fmt.Fprintf(w, "OUTSIDE ±%.0f%%: %s; worst %.0f%%\n", AccuracyGoal*100, strings.Join(outside, ", "), worst*100)
	}
	return worst
}

// predicted reports whether the scenario has a prediction to compare (not a
// calibration row).
func predicted(s Scenario) bool {
	return s.CalibratesOpenTime == "" && s.PredictedRestoreSeconds > 0
}

// worstError is a report's worst |Δ| over its predicted scenarios (-1:
// none).
func worstError(r *Report) float64 {
	worst := -1.0
	for _, s := range r.Scenarios {
		if predicted(s) {
			worst = max(worst, math.Abs(s.PredictionError))
		}
	}
	return worst
}

func findScenario(r *Report, name string) (Scenario, bool) {
	for _, s := range r.Scenarios {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

// accuracyCell is "measured / predicted / Δ" for one scenario of one drill.
func accuracyCell(s Scenario) string {
	m := restoreText(s)
	if !s.StateEqual {
		m += " STATE DIFFERS"
	}
	return fmt.Sprintf("%s / %s / %s", m, predictedText(s), deltaText(s))
}
