package engine

import (
	"context"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publishOutputs creates the stream OUT and publishes n outputs (Cairn-Out
// 1..n) to each of the key groups kgs, round by round; it returns each key
// group's last stream sequence.
func publishOutputs(t testing.TB, js jetstream.JetStream, kgs []int, n int) map[int]uint64 {
	t.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}}); err != nil {
		t.Fatal(err)
	}
	last := map[int]uint64{}
	for i := 1; i <= n; i++ {
		for _, kg := range kgs {
			m := &nats.Msg{Subject: "out." + strconv.Itoa(kg), Header: nats.Header{HeaderOut: {strconv.Itoa(i)}}, Data: []byte("v")}
			ack, err := js.PublishMsg(ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			last[kg] = ack.Sequence
		}
	}
	return last
}

// TestReadLastOutputs reads every key group's last output, across more key
// groups than one fetch asks for, and leaves out the key groups with none.
func TestReadLastOutputs(t *testing.T) {
	for _, c := range []struct {
		name      string
		keyGroups int
		kgs       []int
	}{
		{"more key groups than a fetch", 1500, kgRange(0, 1500, 1)},
		{"some key groups", 128, kgRange(3, 128, 5)},
		{"one key group", 128, []int{127}},
	} {
		t.Run(c.name, func(t *testing.T) {
			nc := startServer(t)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			want := publishOutputs(t, js, c.kgs, 3)
			cfg := &Config{KeyGroups: c.keyGroups, OutputStream: "OUT", OutputSubject: "out"}
			got, err := readLastOutputs(context.Background(), js, cfg, cfg.targets()[0])
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("read the last outputs of %d key groups, want %d", len(got), len(want))
			}
			for kg, s := range want {
				if lo := got[kg]; lo.Index != 3 || lo.SubjectSeq != s {
					t.Errorf("key group %d: last output %+v, want index 3 at stream sequence %d", kg, lo, s)
				}
			}
		})
	}
}

// TestReadLastOutputsEmpty reads an output stream that holds nothing.
func TestReadLastOutputsEmpty(t *testing.T) {
	nc := startServer(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	publishOutputs(t, js, nil, 0)
	cfg := &Config{KeyGroups: 16, OutputStream: "OUT", OutputSubject: "out"}
	got, err := readLastOutputs(context.Background(), js, cfg, cfg.targets()[0])
	if err != nil || len(got) != 0 {
		t.Fatalf("an empty output stream: %v, %v", got, err)
	}
}

// BenchmarkReadLastOutputs is a restart's read of the output stream under
// exactly once: 128 key groups, a few outputs each. It used to take the
// fetch's whole 300 ms wait whatever the number of key groups.
func BenchmarkReadLastOutputs(b *testing.B) {
	nc := startServer(b)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	publishOutputs(b, js, kgRange(0, 128, 1), 5)
	cfg := &Config{KeyGroups: 128, OutputStream: "OUT", OutputSubject: "out"}
	for b.Loop() {
		got, err := readLastOutputs(context.Background(), js, cfg, cfg.targets()[0])
		if err != nil || len(got) != 128 {
			b.Fatalf("read %d key groups' last outputs, want 128: %v", len(got), err)
		}
	}
}

func kgRange(from, to, step int) []int {
	var s []int
	for i := from; i < to; i += step {
		s = append(s, i)
	}
	return s
}
