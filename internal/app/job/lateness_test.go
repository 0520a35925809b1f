package job

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestAllowedLateness: watermark.allowed_lateness is a duration, 0 when
// left out; a negative one is refused with a job.Error naming the field;
// it survives Marshal and Parse.
func TestAllowedLateness(t *testing.T) {
	j, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if j.Watermark.AllowedLateness != 0 {
		t.Fatalf("default allowed_lateness %v, want 0", j.Watermark.AllowedLateness)
	}

	j, err = Parse([]byte(good + "watermark: {max_out_of_orderness: 2s, allowed_lateness: 1m30s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if j.Watermark.AllowedLateness != 90*time.Second || j.Watermark.MaxOutOfOrderness != 2*time.Second {
		t.Fatalf("watermark %+v, want allowed_lateness 1m30s beside max_out_of_orderness 2s", j.Watermark)
	}
	b, err := j.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(b)
	if err != nil {
		t.Fatalf("marshalled job does not parse: %v\n%s", err, b)
	}
	if back.Watermark.AllowedLateness != 90*time.Second {
		t.Fatalf("allowed_lateness after Marshal and Parse: %v", back.Watermark.AllowedLateness)
	}

	for _, bad := range []string{"-1s", "-1ms"} {
		_, err := Parse([]byte(good + "watermark: {allowed_lateness: " + bad + "}\n"))
		var je *Error
		if !errors.As(err, &je) || je.Field != "watermark.allowed_lateness" || !strings.Contains(je.Reason, "must not be negative") {
			t.Errorf("allowed_lateness %s: %v, want a job.Error naming watermark.allowed_lateness", bad, err)
		}
	}
	if _, err := Parse([]byte(good + "watermark: {allowed_lateness: soon}\n")); err == nil {
		t.Error("allowed_lateness: soon was accepted")
	}
}
