package runtime

import (
	"testing"
	"time"

	"cairn/recovery/model"
)

// TestAdviserRemembers: the dashboard's adviser keeps the newest full
// checkpoint it saw retained after retention dropped it.
func TestAdviserRemembers(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var a adviser
	full := model.AdviseCheckpoint{ID: 1, Mode: model.Full, Time: t0}
	inc := func(id uint64) model.AdviseCheckpoint {
		return model.AdviseCheckpoint{ID: id, Mode: model.Incremental, Time: t0.Add(time.Duration(id) * time.Second)}
	}
	if got := a.remember("j", []model.AdviseCheckpoint{full, inc(2)}); len(got) != 2 {
		t.Fatalf("with both retained: %+v", got)
	}
	got := a.remember("j", []model.AdviseCheckpoint{inc(2), inc(3)})
	if len(got) != 3 || got[0].ID != 1 || !got[0].Gone || got[0].Mode != model.Full {
		t.Fatalf("after the full one was dropped: %+v, want it remembered (Gone) first", got)
	}
	if got := a.remember("other", []model.AdviseCheckpoint{inc(5)}); len(got) != 1 {
		t.Fatalf("another chain sees this one's: %+v", got)
	}
}
