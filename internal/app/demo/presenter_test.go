package demo

import (
	"strings"
	"testing"
	"time"
)

// TestBudgetLine: the line the presenter points at says both numbers and
// their ratio, a measurement over a prediction, and waits for checkpoints.
func TestBudgetLine(t *testing.T) {
	for _, c := range []struct {
		ck, pred, meas float64
		want           string
	}{
		{0, 22, 0, "waiting for 5 checkpoints"},
		{0.2, 0, 0, "from the checkpoint duration: 200ms; from a restore from the store: calibrating"},
		{0.2, 22, 0, "from the checkpoint duration: 200ms; from a restore from the store: 22s predicted (110× more)"},
		{0.2, 22, 25, "from the checkpoint duration: 200ms; from a restore from the store: 25s measured (125× more)"},
	} {
		if got := budgetLine(c.ck, c.pred, c.meas); !strings.Contains(got, c.want) {
			t.Errorf("budgetLine(%v, %v, %v) = %q, want %q in it", c.ck, c.pred, c.meas, got, c.want)
		}
	}
	said := budgetLine(0.2, 22, 0)
	if budgetChanged(said, budgetLine(0.25, 23, 0)) {
		t.Error("a prediction 5% off the one said is said again")
	}
	if !budgetChanged(said, budgetLine(0.2, 31, 0)) || !budgetChanged(said, budgetLine(0.2, 22, 22.5)) || !budgetChanged("", said) {
		t.Error("a new number, a measurement or a first line is not said")
	}
}

func TestChainTextAndPlural(t *testing.T) {
	if chainText("full", 1) != "full" || chainText("incremental", 1) != "incremental, chain 1" {
		t.Errorf("a full checkpoint and the incremental after it read %q and %q", chainText("full", 1), chainText("incremental", 1))
	}
	if plural(1, "restore") != "1 restore" || plural(3, "restore") != "3 restores" || plural(0, "restore") != "0 restores" {
		t.Error("plural")
	}
	if got := offBy(25500*time.Millisecond, 22200*time.Millisecond, true); got != ", +15%" {
		t.Errorf("offBy = %q", got)
	}
	if offBy(time.Second, 0, false) != "" {
		t.Error("offBy without a prediction")
	}
}

// TestSeedStateShape: the ballast keys are never words, and the job YAML at
// scale turns the scrub off and caps the online download.
func TestScaleJobYAML(t *testing.T) {
	if k := string(ballastKey(nil, 42)); !strings.HasPrefix(k, "~") {
		t.Errorf("ballast key %q could be a word", k)
	}
	y := demoJobYAML(2, 0, 18750000)
	for _, want := range []string{"full_every: 0", `scrub_rate: "off"`, "download_rate: 18750000B"} {
		if !strings.Contains(y, want) {
			t.Errorf("job at scale lacks %q:\n%s", want, y)
		}
	}
	if y := demoJobYAML(2, 10, 0); strings.Contains(y, "scrub_rate") || strings.Contains(y, "download_rate") || !strings.Contains(y, "full_every: 10") {
		t.Errorf("job at the small scale:\n%s", y)
	}
}
