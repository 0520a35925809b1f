package group

import (
	"testing"
	"time"
)

// TestEventCaughtUp: a catch-up figure lands on the event it was measured
// for, also after later events; one for an event already evicted from
// the last maxEvents is dropped.
func TestEventCaughtUp(t *testing.T) {
	m := &Member{}
	first := m.record(Event{Gained: []string{"a"}})
	second := m.record(Event{Gained: []string{"b"}})
	m.caughtUp(first, 3*time.Second, 120)
	evs := m.Events()
	if evs[0].CaughtUpAfter != 3*time.Second || evs[0].Backlog != 120 || evs[1].CaughtUpAfter != 0 {
		t.Fatalf("events %+v", evs)
	}
	for range maxEvents {
		m.record(Event{})
	}
	m.caughtUp(second, time.Second, 1) // evicted: nothing to set
	for _, e := range m.Events() {
		if e.CaughtUpAfter != 0 {
			t.Fatalf("an evicted event's figure landed on %+v", e)
		}
	}
}
