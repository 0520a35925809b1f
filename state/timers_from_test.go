package state

import (
	"fmt"
	"testing"
)

// TestTimersFrom: the walks that start at a floor skip the timers below it,
// and DueTimersFrom reports the earliest timer after upTo.
func TestTimersFrom(t *testing.T) {
	o := testOptions()
	o.Range = KeyGroupRange{First: 2, Last: 9}
	d := openDB(t, t.TempDir(), o)
	b := d.NewBatch()
	b.SetTimer(1, 3, DomainEventTime, 10, []byte("a"))
	b.SetTimer(1, 3, DomainEventTime, 30, []byte("b"))
	b.SetTimer(1, 7, DomainEventTime, 20, []byte("c"))
	b.SetTimer(1, 8, DomainEventTime, 45, []byte("d"))
	b.SetTimer(1, 8, DomainProcessingTime, 1, []byte("p"))
	b.Put(1, 5, []byte("value"), nil, []byte("v"))
	commit(t, b)
	if ts, ok, err := d.NextTimerFrom(1, DomainEventTime, 11); err != nil || !ok || ts != 20 {
		t.Fatalf("NextTimerFrom(11) = %d, %v, %v; want 20", ts, ok, err)
	}
	if _, ok, err := d.NextTimerFrom(1, DomainEventTime, 46); err != nil || ok {
		t.Fatalf("NextTimerFrom(46) = %v, %v; want none", ok, err)
	}
	for _, tc := range []struct {
		from, upTo int64
		due        string
		next       int64
		ok         bool
	}{
		{-100, 25, "[3:10:a 7:20:c]", 30, true},
		{15, 25, "[7:20:c]", 30, true},
		{15, 30, "[3:30:b 7:20:c]", 45, true},
		{0, 45, "[3:10:a 3:30:b 7:20:c 8:45:d]", 0, false},
		{46, 100, "[]", 0, false},
	} {
		var due []string
		next, ok, err := d.DueTimersFrom(1, DomainEventTime, tc.from, tc.upTo, func(kg int, ts int64, user []byte) error {
			due = append(due, fmt.Sprintf("%d:%d:%s", kg, ts, user))
			return nil
		})
		if err != nil || fmt.Sprint(due) != tc.due || ok != tc.ok || (ok && next != tc.next) {
			t.Errorf("DueTimersFrom(%d, %d) = %v, next %d %v, %v; want %s, next %d %v", tc.from, tc.upTo, due, next, ok, err, tc.due, tc.next, tc.ok)
		}
	}
}
