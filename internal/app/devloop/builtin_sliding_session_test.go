package devloop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The builtins sliding_count and session_count under `cairn test`: exact
// outputs of small hand-computed inputs, by event time and by processing
// time, each with a restore every few records (rescaled 2 -> 3 -> 1 -> 2
// slots) whose replay must regenerate the same outputs; a larger random
// input against a model; and the refusal of a config they cannot use.

const ssBase = 1_700_000_000_000 // a multiple of 100: windows align on it

// ssRun writes the job (one keyed stage with this module and config, the
// watermark bound) and the records, runs `cairn test --state` with
// --restore-every, and returns every key's outputs ("value@time", offsets
// from ssBase), the final state's keys and stderr.
func ssRun(t *testing.T, module, config, bound string, every int, recs []testRecord) (outs map[string][]string, stateKeys []string, stderr string) {
	t.Helper()
	dir := t.TempDir()
	jobFile := filepath.Join(dir, "job.yaml")
	yaml := fmt.Sprintf(`name: ss
input: {stream: IN, subjects: ["in.>"]}
stages:
  - {name: win, module: %q, keyed: true, config: %s}
output: {stream: OUT, subject: out, delivery: exactly_once}
watermark: {max_out_of_orderness: %s}
key_groups: 16
slots: 2
`, module, config, bound)
	if err := os.WriteFile(jobFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	for _, r := range recs {
		line, _ := json.Marshal(r)
		in.Write(append(line, '\n'))
	}
	input := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(input, in.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	args := []string{"--job", jobFile, "--input", input, "--state", "--restore-every", fmt.Sprint(every)}
	if err := TestCommand(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if !strings.Contains(errb.String(), "outputs identical to an uninterrupted run") {
		t.Fatalf("no restore summary:\n%s", errb.String())
	}
	outs = map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var st struct{ Key, Sub, Value *string }
		if err := json.Unmarshal([]byte(l), &st); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		if st.Sub != nil {
			stateKeys = append(stateKeys, *st.Key)
			continue
		}
		var o testOutput
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatal(err)
		}
		outs[o.Key] = append(outs[o.Key], fmt.Sprintf("%s@%d", ssRebase(t, o.Value), o.Time-ssBase))
	}
	slices.Sort(stateKeys)
	return outs, slices.Compact(stateKeys), errb.String()
}

// ssRebase rewrites the times in a value ("start,count" or
// "first,last,count") as offsets from ssBase.
func ssRebase(t *testing.T, v string) string {
	f := strings.Split(v, ",")
	for i := range len(f) - 1 {
		var n int64
		if _, err := fmt.Sscan(f[i], &n); err != nil {
			t.Fatalf("output %q: %v", v, err)
		}
		f[i] = fmt.Sprint(n - ssBase)
	}
	return strings.Join(f, ",")
}

// ssEv is a record at event time ssBase+off (ingestion time: the event time,
// or the previous + 1 ms).
func ssEv(key string, off int64) testRecord {
	t := ssBase + off
	return testRecord{Key: key, Value: "v", Time: &t}
}

// ssPT is a record ingested at ssBase+off, its event time that too.
func ssPT(key string, off int64) testRecord {
	t := ssBase + off
	return testRecord{Key: key, Value: "v", TS: &t}
}

func ssTick(off int64) testRecord {
	t := ssBase + off
	return testRecord{Tick: true, TS: &t}
}

func ssCheck(t *testing.T, got map[string][]string, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if g := strings.Join(got[k], " "); g != w {
			t.Errorf("key %s:\n got %s\nwant %s", k, g, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected outputs of key %s: %v", k, got[k])
		}
	}
}

// TestCairnTestSlidingCountEventTime: 30 ms windows every 10 ms, records
// out of order within the 20 ms bound and one late record (dead-lettered,
// counted nowhere). Each window is emitted once, at its end - 1, with the
// records of its three buckets; windows without records are not emitted;
// the state left is only that of the window still open.
func TestCairnTestSlidingCountEventTime(t *testing.T) {
	recs := []testRecord{
		ssEv("a", 5), ssEv("a", 12), ssEv("b", 14), ssEv("a", 25), ssEv("a", 8), // 8: out of order, within the bound
		ssEv("b", 40), // watermark 19: windows -20 and -10 close
		ssEv("a", 31),
		ssEv("a", 3), // late: behind the watermark 19
		ssEv("a", 70),
		ssEv("flush", 1000), // closes every window of a and b
	}
	outs, stateKeys, stderr := ssRun(t, "builtin:sliding_count", "{size_ms: 30, slide_ms: 10}", "20ms", 3, recs)
	ssCheck(t, outs, map[string]string{
		// a's buckets: 0:2 10:1 20:1 30:1 70:1
		"a": "-20,2@9 -10,3@19 0,4@29 10,3@39 20,2@49 30,1@59 50,1@79 60,1@89 70,1@99",
		// b's buckets: 10:1 40:1
		"b": "-10,1@19 0,1@29 10,1@39 20,1@49 30,1@59 40,1@69",
	})
	if !slices.Equal(stateKeys, []string{"flush"}) {
		t.Errorf("state left for keys %v, want only the open windows' key flush", stateKeys)
	}
	if strings.Count(stderr, "dead letter:") != 1 || !strings.Contains(stderr, "late event") {
		t.Errorf("want one dead letter, the late record:\n%s", stderr)
	}
}

// TestCairnTestSlidingCountProcessingTime: 100 ms windows every 50 ms by
// the ingestion clock; a logged tick fires the last timers.
func TestCairnTestSlidingCountProcessingTime(t *testing.T) {
	recs := []testRecord{ssPT("a", 0), ssPT("a", 20), ssPT("b", 60), ssPT("a", 110), ssTick(400)}
	outs, stateKeys, _ := ssRun(t, "builtin:sliding_count", "{size_ms: 100, slide_ms: 50, time: processing}", "0ms", 2, recs)
	ssCheck(t, outs, map[string]string{
		"a": "-50,2@49 0,2@99 50,1@149 100,1@199",
		"b": "0,1@99 50,1@149",
	})
	if len(stateKeys) != 0 {
		t.Errorf("state left for keys %v", stateKeys)
	}
}

// TestCairnTestSessionCountEventTime: sessions with a 10 ms gap. Records out
// of order bridge and merge sessions (112 joins 100-105 with 120, then 125
// joins that with 130); records exactly the gap apart start a new session;
// a record that would have joined a closed session is late (behind the
// watermark) and dead-lettered, as window_count's late records are.
func TestCairnTestSessionCountEventTime(t *testing.T) {
	recs := []testRecord{
		ssEv("a", 100), ssEv("a", 105), ssEv("a", 130), ssEv("a", 120), ssEv("a", 112), ssEv("a", 125),
		ssEv("b", 200), // watermark 179: a's session 100-130 closes at 139
		ssEv("b", 250), // watermark 229: b's session 200 closes at 209
		ssEv("a", 240),
		ssEv("a", 135),      // late: would extend the closed session 100-130
		ssEv("flush", 1000), // closes a's 240 and b's 250
	}
	outs, stateKeys, stderr := ssRun(t, "builtin:session_count", "{gap_ms: 10}", "20ms", 3, recs)
	ssCheck(t, outs, map[string]string{
		"a": "100,130,6@139 240,240,1@249",
		"b": "200,200,1@209 250,250,1@259",
	})
	if !slices.Equal(stateKeys, []string{"flush"}) {
		t.Errorf("state left for keys %v, want only the open session's key flush", stateKeys)
	}
	if strings.Count(stderr, "dead letter:") != 1 || !strings.Contains(stderr, "late event") {
		t.Errorf("want one dead letter, the late record:\n%s", stderr)
	}
}

// TestCairnTestSessionCountProcessingTime: sessions with a 100 ms gap by
// the ingestion clock: a session's timer fires before the first record
// whose clock reached it, which then starts a new session.
func TestCairnTestSessionCountProcessingTime(t *testing.T) {
	recs := []testRecord{ssPT("a", 0), ssPT("a", 50), ssPT("b", 60), ssPT("a", 140), ssPT("a", 300), ssTick(1000)}
	outs, stateKeys, _ := ssRun(t, "builtin:session_count", "{gap_ms: 100, time: processing}", "0ms", 2, recs)
	ssCheck(t, outs, map[string]string{
		"a": "0,140,3@239 300,300,1@399",
		"b": "60,60,1@159",
	})
	if len(stateKeys) != 0 {
		t.Errorf("state left for keys %v", stateKeys)
	}
}

// TestCairnTestSlidingSessionModel: 1500 records over 5 keys, out of order
// within the bound, with late ones and pauses, restored every 100 records:
// both builtins' outputs equal a model's (computed from the admitted
// records alone), key by key in order, and no state but the flush key's is
// left.
func TestCairnTestSlidingSessionModel(t *testing.T) {
	const (
		bound        = 50
		size, slide  = 60, 20
		gap          = 25
		n            = 1500
		flushAt      = 1 << 20
		restoreEvery = 100
	)
	rng := rand.New(rand.NewPCG(12, 34))
	keys := []string{"k0", "k1", "k2", "k3", "k4"}
	var recs []testRecord
	admitted := map[string][]int64{}
	maxT, late := int64(-1<<62), 0
	clock := int64(0)
	for i := range n {
		clock += 2
		if i%97 == 96 {
			clock += 150 // a pause: sessions end, windows close
		}
		off := clock - rng.Int64N(bound)
		if i%61 == 60 {
			off = clock - bound - 20 - rng.Int64N(100) // behind the watermark, mostly
		}
		k := keys[rng.IntN(len(keys))]
		recs = append(recs, ssEv(k, off))
		if off <= maxT-bound-1 {
			late++
			continue
		}
		maxT = max(maxT, off)
		admitted[k] = append(admitted[k], off)
	}
	recs = append(recs, ssEv("flush", flushAt))
	if late == 0 {
		t.Fatal("no late records in the corpus")
	}

	// The models: every window / session of the admitted records, in order.
	wantSliding, wantSession := map[string]string{}, map[string]string{}
	for k, ts := range admitted {
		buckets := map[int64]int{}
		lo, hi := int64(1<<62), int64(-1<<62)
		for _, t := range ts {
			b := ssFloorDiv(t, slide) * slide
			buckets[b]++
			lo, hi = min(lo, b), max(hi, b)
		}
		var w []string
		for s := lo - size + slide; s <= hi; s += slide {
			c := 0
			for b := s; b < s+size; b += slide {
				c += buckets[b]
			}
			if c > 0 {
				w = append(w, fmt.Sprintf("%d,%d@%d", s, c, s+size-1))
			}
		}
		wantSliding[k] = strings.Join(w, " ")
		sorted := slices.Clone(ts)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		var ss []string
		first, count := sorted[0], 1
		for i := 1; i <= len(sorted); i++ {
			if i == len(sorted) || sorted[i]-sorted[i-1] >= gap {
				last := sorted[i-1]
				ss = append(ss, fmt.Sprintf("%d,%d,%d@%d", first, last, count, last+gap-1))
				if i < len(sorted) {
					first, count = sorted[i], 0
				}
			}
			count++
		}
		wantSession[k] = strings.Join(ss, " ")
	}
	sessions := 0
	for _, s := range wantSession {
		sessions += strings.Count(s, " ") + 1
	}
	// The corpus must have records that bridge two open sessions (in
	// arrival order), or it would not test merging.
	bridges := 0
	for _, ts := range admitted {
		var open [][2]int64 // the key's sessions so far, as the operator sees them
		for _, t := range ts {
			m := [2]int64{t, t}
			var rest [][2]int64
			joined := 0
			for _, s := range open {
				if s[0]-gap < t && t < s[1]+gap {
					m = [2]int64{min(m[0], s[0]), max(m[1], s[1])}
					joined++
				} else {
					rest = append(rest, s)
				}
			}
			if joined >= 2 {
				bridges++
			}
			open = append(rest, m)
		}
	}
	if bridges == 0 {
		t.Fatal("no record bridges two sessions")
	}
	t.Logf("%d records, %d late, %d sessions, %d records bridging two", n, late, sessions, bridges)

	outs, stateKeys, stderr := ssRun(t, "builtin:sliding_count", fmt.Sprintf("{size_ms: %d, slide_ms: %d}", size, slide), fmt.Sprintf("%dms", bound), restoreEvery, recs)
	ssCheck(t, outs, wantSliding)
	if !slices.Equal(stateKeys, []string{"flush"}) {
		t.Errorf("sliding_count: state left for keys %v", stateKeys)
	}
	if got := strings.Count(stderr, "dead letter:"); got != late {
		t.Errorf("sliding_count: %d dead letters, want %d", got, late)
	}

	outs, stateKeys, stderr = ssRun(t, "builtin:session_count", fmt.Sprintf("{gap_ms: %d}", gap), fmt.Sprintf("%dms", bound), restoreEvery, recs)
	ssCheck(t, outs, wantSession)
	if !slices.Equal(stateKeys, []string{"flush"}) {
		t.Errorf("session_count: state left for keys %v", stateKeys)
	}
	if got := strings.Count(stderr, "dead letter:"); got != late {
		t.Errorf("session_count: %d dead letters, want %d", got, late)
	}
}

func ssFloorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// TestCairnTestSlidingSessionConfigRefused: a config the operator cannot
// use stops the job before any input, with the operator's message.
func TestCairnTestSlidingSessionConfigRefused(t *testing.T) {
	for _, tc := range []struct{ module, config, want string }{
		{"builtin:sliding_count", "{size_ms: 60000, slide_ms: 25000}", `config "slide_ms" 25000 does not divide "size_ms" 60000`},
		{"builtin:session_count", "{gap_ms: 0}", `config "gap_ms" is 0, want a positive number of milliseconds`},
		{"builtin:session_count", "{gap_ms: -1000}", `config "gap_ms" is -1000, want a positive number of milliseconds`},
	} {
		jobFile, input := writeTestJob(t, tc.module, "exactly_once", ", config: "+tc.config, 10)
		var errb bytes.Buffer
		err := TestCommand(context.Background(), []string{"--job", jobFile, "--input", input}, &bytes.Buffer{}, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"op"`) {
			t.Errorf("%s %s: got %v\nwant a refusal naming the stage \"op\" and saying %q", tc.module, tc.config, err, tc.want)
		}
	}
}
