package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/testutil/wait"
	"cairn/state"
)

// orderPayJob joins orders with the payments that arrive within 10 minutes
// of event time (examples/orderpay.yaml): two inputs, one keyed two-input
// stage. Sub-topologies: orders -> side 0 and payments -> side 1 of one
// repartition stream, read by the join.
func orderPayJob(t testing.TB, url, data, store string, slots int) string {
	return testJobYAML(t, orderPaySpec(url), data, store, slots)
}

// orderPaySpec is the orders ⋈ payments job on the NATS server at url.
func orderPaySpec(url string) *job.Job {
	return &job.Job{
		Name: "orderpay", NATS: url,
		Inputs: []job.Input{
			{Name: "orders", Stream: "ORDERS", Subjects: []string{"orders.>"}},
			{Name: "payments", Stream: "PAYMENTS", Subjects: []string{"payments.>"}},
		},
		Stages: []job.Stage{
			{Name: "join", Module: "builtin:interval_join", Keyed: true, From: []string{"orders", "payments"},
				Config: map[string]any{"lower_ms": 0, "upper_ms": 600_000}},
		},
		Output: job.Output{Stream: "PAID", Subject: "paid", Delivery: "exactly_once"},
	}
}

// orderPayInput generates orders (one a second of event time) and 0-2
// payments each, from 60 s before to 12 min after their order (some fall
// outside the join's bounds), and publishes them in rounds: each stream in
// event-time order, the two streams interleaved as they come.
type orderPayInput struct {
	t        testing.TB
	js       jetstream.JetStream
	rng      *rand.Rand
	orders   []opEvent
	payments []opEvent // sorted by time once generated
	nextO    int       // orders published
	nextP    int       // payments published
}

type opEvent struct {
	key, value string
	time       int64
}

const opBase = int64(1_700_000_000_000)

func newOrderPayInput(t testing.TB, js jetstream.JetStream, rng *rand.Rand, n int) *orderPayInput {
	in := &orderPayInput{t: t, js: js, rng: rng}
	for i := range n {
		o := opEvent{key: "o" + strconv.Itoa(i), value: "order" + strconv.Itoa(i), time: opBase + int64(i)*1000}
		in.orders = append(in.orders, o)
		for p := range rng.IntN(3) {
			d := int64(rng.IntN(780_000)) - 60_000
			in.payments = append(in.payments, opEvent{key: o.key, value: fmt.Sprintf("pay%d.%d", i, p), time: o.time + d})
		}
	}
	sort.SliceStable(in.payments, func(a, b int) bool { return in.payments[a].time < in.payments[b].time })
	return in
}

// publish sends the next n orders and the payments up to the last of
// them's time plus 6 minutes.
func (in *orderPayInput) publish(n int) {
	var msgs []*nats.Msg
	msg := func(subject string, e opEvent) *nats.Msg {
		return &nats.Msg{Subject: subject, Header: nats.Header{engine.HeaderKey: {e.key}, engine.HeaderTime: {strconv.FormatInt(e.time, 10)}}, Data: []byte(e.value)}
	}
	end := min(in.nextO+n, len(in.orders))
	for ; in.nextO < end; in.nextO++ {
		msgs = append(msgs, msg("orders.new", in.orders[in.nextO]))
	}
	upTo := in.orders[end-1].time + 360_000
	if end == len(in.orders) {
		upTo = 1 << 62
	}
	for ; in.nextP < len(in.payments) && in.payments[in.nextP].time <= upTo; in.nextP++ {
		msgs = append(msgs, msg("payments.new", in.payments[in.nextP]))
	}
	publishAll(in.t, in.js, interleave(in.rng, msgs))
}

// interleave merges the orders and payments of msgs (each in order) at
// random.
func interleave(rng *rand.Rand, msgs []*nats.Msg) []*nats.Msg {
	var o, p []*nats.Msg
	for _, m := range msgs {
		if m.Subject == "orders.new" {
			o = append(o, m)
		} else {
			p = append(p, m)
		}
	}
	out := make([]*nats.Msg, 0, len(msgs))
	for len(o) > 0 || len(p) > 0 {
		if len(p) == 0 || (len(o) > 0 && rng.IntN(2) == 0) {
			out, o = append(out, o[0]), o[1:]
		} else {
			out, p = append(out, p[0]), p[1:]
		}
	}
	return out
}

// model is every (key, order|payment) pair the join must emit: the
// payment's time in [order, order + 10 min].
func (in *orderPayInput) model() map[string]int {
	byKey := map[string][]opEvent{}
	for _, o := range in.orders[:in.nextO] {
		byKey[o.key] = append(byKey[o.key], o)
	}
	want := map[string]int{}
	for _, p := range in.payments[:in.nextP] {
		for _, o := range byKey[p.key] {
			if p.time >= o.time && p.time <= o.time+600_000 {
				want[p.key+"="+o.value+"|"+p.value]++
			}
		}
	}
	return want
}

// checkJoined reads PAID and compares it with the model: every pair once,
// nothing else, Cairn-Out gap-free per key group subject; and the
// repartition stream's two sides each gap-free with markers in place.
func checkJoined(t *testing.T, js jetstream.JetStream, want map[string]int) {
	t.Helper()
	n := sum(want)
	out := readStream(t, js, "PAID", n)
	lastValues(t, out, "paid", 16)
	checkCounts(t, keyedValues(out), want)
	rp := readStream(t, js, "CAIRN_RP_ORDERPAY_2", 0)
	sides := map[string]bool{}
	for _, m := range rp {
		sides[m.Subject()[:len("cairn.rp.orderpay.2.0")]] = true
	}
	if !sides["cairn.rp.orderpay.2.0"] || !sides["cairn.rp.orderpay.2.1"] {
		t.Errorf("repartition stream subjects: %v, want both sides", sides)
	}
	markers := checkRepartition(t, rp)
	t.Logf("%d joined outputs exact; repartition stream: %d messages (%d markers)", len(out), len(rp), markers)
}

// diagnoseJoin logs, for a join test that failed, which orders' pairs are
// missing from PAID or there more than once (order numbers, as ranges) and
// what the repartition stream holds of each side: whether the pairs of a
// whole range of orders went missing, and from which side, is where a
// diagnosis of a loss starts.
func diagnoseJoin(t *testing.T, js jetstream.JetStream, want map[string]int) {
	t.Helper()
	paid := readStream(t, js, "PAID", 0)
	got := keyedValues(paid)
	// Per key group subject: how many outputs, the highest Cairn-Out, and
	// the indexes missing below it (a gap is a publish lost; none with
	// fewer outputs than the model is pairs the join never made).
	type subjOuts struct {
		n, max uint64
		seen   map[uint64]bool
	}
	bySubj := map[string]*subjOuts{}
	for _, m := range paid {
		o := bySubj[m.Subject()]
		if o == nil {
			o = &subjOuts{seen: map[uint64]bool{}}
			bySubj[m.Subject()] = o
		}
		idx, _ := strconv.ParseUint(m.Headers().Get(engine.HeaderOut), 10, 64)
		o.n++
		o.max = max(o.max, idx)
		o.seen[idx] = true
	}
	var subjLines []string
	for subj, o := range bySubj {
		var gaps []int
		for i := uint64(1); i <= o.max; i++ {
			if !o.seen[i] {
				gaps = append(gaps, int(i))
			}
		}
		subjLines = append(subjLines, fmt.Sprintf("%s: %d outputs, highest %d, missing %s", subj, o.n, o.max, numberRanges(gaps)))
	}
	slices.Sort(subjLines)
	t.Logf("join diagnosis: PAID per subject:\n%s", strings.Join(subjLines, "\n"))
	var missing, extra []int
	for k, n := range want {
		i := orderNumber(k)
		if got[k] < n {
			missing = append(missing, i)
		}
	}
	for k, n := range got {
		if n > want[k] {
			i := orderNumber(k)
			extra = append(extra, i)
		}
	}
	t.Logf("join diagnosis: pairs missing for %d orders %s; pairs extra or repeated for %d orders %s",
		len(missing), numberRanges(missing), len(extra), numberRanges(extra))
	rp := readStream(t, js, "CAIRN_RP_ORDERPAY_2", 0)
	data := map[string]int{}
	var first, last uint64
	for i, m := range rp {
		if md, err := m.Metadata(); err == nil {
			if i == 0 {
				first = md.Sequence.Stream
			}
			last = md.Sequence.Stream
		}
		if m.Headers().Get(engine.HeaderMarker) == "" {
			data[m.Subject()[:len("cairn.rp.orderpay.2.0")]]++
		}
	}
	t.Logf("join diagnosis: the repartition stream holds sequences %d-%d (%d messages, purged below the first), records per side %v", first, last, len(rp), data)
	diagnoseTap(t, want, got)
	// The input streams and what their consumers (cairn's sources) say
	// they delivered and have pending: a source that stopped reading
	// shows here.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"ORDERS", "PAYMENTS", "CAIRN_RP_ORDERPAY_2", "PAID", "CAIRN_DLQ_ORDERPAY"} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Logf("join diagnosis: stream %s: %v", name, err)
			continue
		}
		info := st.CachedInfo()
		leader := ""
		if info.Cluster != nil {
			leader = info.Cluster.Leader
		}
		line := fmt.Sprintf("stream %s: %d messages, sequences %d-%d, leader %q", name, info.State.Msgs, info.State.FirstSeq, info.State.LastSeq, leader)
		if name == "CAIRN_DLQ_ORDERPAY" && info.State.Msgs > 0 {
			// Why the job dead-lettered records, and which stage.
			if m, err := st.GetMsg(ctx, info.State.FirstSeq); err == nil {
				line += fmt.Sprintf(", the first: stage %q, %q", m.Header.Get(engine.HeaderStage), m.Header.Get(engine.HeaderError))
			}
		}
		if name == "ORDERS" || name == "PAYMENTS" {
			// Which events the first and the last sequence hold: an input
			// the cluster lost or renumbered shows here.
			for _, seq := range []uint64{info.State.FirstSeq, info.State.LastSeq} {
				if m, err := st.GetMsg(ctx, seq); err == nil {
					line += fmt.Sprintf(", seq %d holds %s", seq, m.Data)
				}
			}
		}
		for c := range st.ListConsumers(ctx).Info() {
			line += fmt.Sprintf("; consumer %s: delivered stream seq %d, ack floor %d, pending %d, waiting pulls %d, filter %v",
				c.Name, c.Delivered.Stream, c.AckFloor.Stream, c.NumPending, c.NumWaiting, c.Config.FilterSubjects)
		}
		t.Logf("join diagnosis: %s", line)
	}
}

// orderNumber is the order number of a pair's key "o<n>=...", -1 when the
// key is not one (an output without the key header, say).
func orderNumber(k string) int {
	key, _, _ := strings.Cut(k, "=")
	n, err := strconv.Atoi(strings.TrimPrefix(key, "o"))
	if err != nil || !strings.HasPrefix(key, "o") {
		return -1
	}
	return n
}

// numberRanges writes ns (sorting it) as "[a-b c ...]": runs of consecutive
// numbers as ranges.
func numberRanges(ns []int) string {
	slices.Sort(ns)
	var b strings.Builder
	b.WriteByte('[')
	for i := 0; i < len(ns); {
		j := i
		for j+1 < len(ns) && ns[j+1] <= ns[j]+1 {
			j++
		}
		if b.Len() > 1 {
			b.WriteByte(' ')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", ns[i], ns[j])
		} else {
			fmt.Fprintf(&b, "%d", ns[i])
		}
		i = j + 1
	}
	b.WriteByte(']')
	return b.String()
}

// TestJobGraphJoin runs orders ⋈ payments (two inputs, an interval join)
// as a job graph of three sub-topologies, crashes it (no final
// checkpoint) while input arrives, restarts it on other slot counts, and
// checks the output is exactly the model's pairs, each once.
func TestJobGraphJoin(t *testing.T) {
	rng := rand.New(rand.NewPCG(graphSeed(t), 2))
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "ORDERS", "orders.>")
	createStream(t, js, "PAYMENTS", "payments.>")
	data, store := t.TempDir(), "file://"+t.TempDir()+"?create_dir=true"
	in := newOrderPayInput(t, js, rng, 900)

	slots := []int{2, 3, 1}
	for round, n := range slots {
		in.publish(300)
		j, err := job.Parse([]byte(orderPayJob(t, url, data, store, n)))
		if err != nil {
			t.Fatal(err)
		}
		r, err := runtime.Start(context.Background(), j, runtime.Options{}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Downstream) != 2 {
			t.Fatalf("%d sub-topologies, want 3", 1+len(r.Downstream))
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		if round == len(slots)-1 {
			want := in.model()
			total := sum(want)
			wait.Until(t, time.Minute, fmt.Sprintf("%d joined outputs", total), func() error {
				if n := streamMsgs(t, js, "PAID"); n < total {
					return fmt.Errorf("%d outputs", n)
				}
				return nil
			})
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			r.Close()
			checkJoined(t, js, want)
			break
		}
		// Crash once the join has committed a checkpoint of this run, while
		// the sides are part way through their inputs.
		join := r.SubTopologies()[2].Engine
		wait.Until(t, time.Minute, "a checkpoint of the join", func() error {
			if len(join.Checkpoints()) == 0 {
				return fmt.Errorf("none yet")
			}
			return nil
		})
		waitProcessed(t, r.Engine, uint64(in.nextO-rng.IntN(200)))
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		for _, s := range r.SubTopologies() {
			s.Engine.Kill()
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		r.Close()
	}
}

// TestJobGraphJoinKillNine runs orders ⋈ payments as the cairn binary and
// SIGKILLs it at random moments while it works through its inputs (5
// times a case), restarting it on random slot counts (1-4, the sides and
// the join each their own), then checks the output is exactly the model's
// pairs, each once, with Cairn-Out gap-free on the output and on both sides
// of the repartition stream.
func TestJobGraphJoinKillNine(t *testing.T) {
	forKillCases(t, 10, joinKillRun)
}

// joinKillCase is joinKillRun on the NATS server at url with a store of
// kind storeKind; it returns the kills (the reliability soak's entry).
func joinKillCase(t *testing.T, bin, url string, rng *rand.Rand, storeKind, mode string) int {
	c := &cairnBinary{t: t, bin: bin}
	k := killConfig{url: url, mode: mode, rng: rng}
	k.store, c.env = killStore(t, storeKind)
	joinKillRun(t, c, k)
	return c.kills
}

// joinKillRun is one case of TestJobGraphJoinKillNine.
func joinKillRun(t *testing.T, c *cairnBinary, k killConfig) {
	_, js := connectJS(t, k.url)
	createStream(t, js, "ORDERS", "orders.>")
	createStream(t, js, "PAYMENTS", "payments.>")
	jobFile := writeJob(t, "orderpay.yaml", orderPayJob(t, k.url, t.TempDir(), k.store, 2), k.mode)
	c.args = func() []string { return append([]string{"--job", jobFile}, randomSlots(k.rng, "join")...) }
	in := newOrderPayInput(t, js, k.rng, 1500)
	in.publish(600)
	for i := range 5 {
		c.start()
		time.Sleep(time.Duration(150+k.rng.IntN(900)) * time.Millisecond)
		if i == 2 {
			in.publish(900) // the rest arrives while it runs
		}
		c.kill()
	}
	want := in.model()
	total := sum(want)
	c.start()
	wait.Until(t, 2*time.Minute, fmt.Sprintf("%d joined outputs", total), func() error {
		c.alive()
		if n := streamMsgs(t, js, "PAID"); n < total {
			return fmt.Errorf("%d outputs", n)
		}
		// Every sub-topology of this run has read all of its input.
		return subTopologiesCaughtUp(c.httpAddr, 3)
	})
	c.stop()
	checkJoined(t, js, want)
}

// subTopologiesCaughtUp asks a running job's /metrics whether its n
// sub-topologies have processed all of their inputs.
func subTopologiesCaughtUp(addr string, n int) error {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	seen := 0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "cairn_subtopology_lag_messages{") {
			continue
		}
		seen++
		if !strings.HasSuffix(line, " 0") {
			return fmt.Errorf("lagging: %s", line)
		}
	}
	if seen != n {
		return fmt.Errorf("%d sub-topologies in /metrics, want %d", seen, n)
	}
	return nil
}

// clicksJob enriches clicks with the users of a NATS KV bucket
// (examples/clicks.yaml): a stream and a table input, one lookup join.
func clicksJob(t testing.TB, url, data, store string, slots int) string {
	j := &job.Job{
		Name: "clicks", NATS: url,
		Inputs: []job.Input{
			{Name: "clicks", Stream: "CLICKS", Subjects: []string{"clicks.>"}},
			{Name: "users", Table: "USERS"},
		},
		Stages: []job.Stage{
			{Name: "enrich", Module: "builtin:lookup_join", Keyed: true, From: []string{"clicks", "users"}},
		},
		Output: job.Output{Stream: "ENRICHED", Subject: "enriched", Delivery: "exactly_once"},
	}
	return testJobYAML(t, j, data, store, slots)
}

// clicksInputs makes the clicks job's inputs: the KV bucket USERS (its
// table) and the stream CLICKS.
func clicksInputs(t testing.TB, js jetstream.JetStream) jetstream.KeyValue {
	t.Helper()
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "USERS"})
	if err != nil {
		t.Fatal(err)
	}
	createStream(t, js, "CLICKS", "clicks.>")
	return kv
}

// TestJobGraphLookupJoin enriches clicks from a KV table in phases: the
// table's rows reach the join's repartition stream before the clicks that
// must see them, then updates and deletes before the next clicks, with a
// crash and a restart on another slot count between the phases. Every
// click is joined with the row of its phase (none: dropped), exactly once.
func TestJobGraphLookupJoin(t *testing.T) {
	url := startNATS(t)
	_, js := connectJS(t, url)
	ctx := context.Background()
	kv := clicksInputs(t, js)
	data, store := t.TempDir(), "file://"+t.TempDir()+"?create_dir=true"

	rows := map[string]string{}
	want := map[string]int{}
	put := func(user, row string) {
		if _, err := kv.Put(ctx, user, []byte(row)); err != nil {
			t.Fatal(err)
		}
		rows[user] = row
	}
	del := func(user string) {
		if err := kv.Delete(ctx, user); err != nil {
			t.Fatal(err)
		}
		delete(rows, user)
	}
	clickN := 0
	clicks := func(n int) {
		var msgs []*nats.Msg
		for range n {
			user := fmt.Sprintf("u%d", clickN%25)
			v := fmt.Sprintf("click%d", clickN)
			clickN++
			msgs = append(msgs, &nats.Msg{Subject: "clicks.web", Header: nats.Header{engine.HeaderKey: {user}}, Data: []byte(v)})
			if row, ok := rows[user]; ok {
				want[user+"="+v+"|"+row]++
			}
		}
		publishAll(t, js, msgs)
	}
	// tableInStream waits until every table entry so far is on the join's
	// repartition stream (side 1), so clicks published after it see them.
	tableInStream := func() { waitTableForwarded(t, js, "USERS", "CAIRN_RP_CLICKS_2", "cairn.rp.clicks.2.1.") }
	outputs := func() int { return sum(want) }
	start := func(slots int) (*runtime.Running, func()) {
		j, err := job.Parse([]byte(clicksJob(t, url, data, store, slots)))
		if err != nil {
			t.Fatal(err)
		}
		r, err := runtime.Start(ctx, j, runtime.Options{}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		return r, func() {
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			r.Close()
		}
	}

	for i := range 20 {
		put(fmt.Sprintf("u%d", i), fmt.Sprintf("name%d.v1", i))
	}
	r, stop := start(2)
	tableInStream()
	clicks(300)
	wait.Until(t, time.Minute, "phase 1 outputs", func() error {
		if n := streamMsgs(t, js, "ENRICHED"); n < outputs() {
			return fmt.Errorf("%d of %d", n, outputs())
		}
		return nil
	})
	// Once the table's forwarder has a checkpoint, a key changes twice
	// and the job crashes: the bucket keeps only the newest revision, so
	// the restarted forwarder's replay from its checkpoint regenerates
	// fewer entries than it forwarded (it skips by entry, not by index).
	table := r.SubTopologies()[1].Engine
	wait.Until(t, time.Minute, "a checkpoint of the table's forwarder", func() error {
		if len(table.Checkpoints()) == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	put("u3", "name3.v1b")
	put("u3", "name3.v1c")
	tableInStream()
	for _, s := range r.SubTopologies() {
		s.Engine.Kill() // a crash: what was published stays, state rolls back
	}
	stop()

	r, stop = start(3)
	for i := range 10 {
		put(fmt.Sprintf("u%d", i), fmt.Sprintf("name%d.v2", i))
	}
	for i := 10; i < 15; i++ {
		del(fmt.Sprintf("u%d", i))
	}
	put("u20", "name20.v1")
	tableInStream()
	clicks(300)
	wait.Until(t, time.Minute, "phase 2 outputs", func() error {
		if n := streamMsgs(t, js, "ENRICHED"); n < outputs() {
			return fmt.Errorf("%d of %d", n, outputs())
		}
		return nil
	})
	stop()
	_ = r

	out := readStream(t, js, "ENRICHED", outputs())
	lastValues(t, out, "enriched", 16)
	checkCounts(t, keyedValues(out), want)
	t.Logf("%d enriched clicks exact (of %d; the others had no row)", len(out), clickN)
}

// streamMsgs is the number of messages in a stream (one API call; no
// consumer, so it can be polled).
func streamMsgs(t testing.TB, js jetstream.JetStream, stream string) int {
	t.Helper()
	st, err := js.Stream(context.Background(), stream)
	if err != nil {
		return 0
	}
	info, err := st.Info(context.Background())
	if err != nil {
		return 0
	}
	return int(info.State.Msgs)
}

// waitTableForwarded waits until every entry KV bucket bucket holds is on
// the repartition stream rp (on subjects with prefix side): per key group,
// the last forwarded entry (Cairn-Src) reaches the bucket's newest entry
// of that key group. The forwarder works in the bucket's order within a
// key group, but its slots publish side by side, so one key group's being
// through says nothing of another's. Revisions the bucket no longer holds
// may never be forwarded (superseded first), which a table allows.
func waitTableForwarded(t testing.TB, js jetstream.JetStream, bucket, rp, side string) {
	t.Helper()
	want := map[int]uint64{} // key group -> the bucket's newest entry in it
	prefix := "$KV." + bucket + "."
	for _, m := range readStream(t, js, "KV_"+bucket, 0) {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		kg := state.KeyGroup([]byte(strings.TrimPrefix(m.Subject(), prefix)), 16)
		want[kg] = max(want[kg], md.Sequence.Stream)
	}
	wait.Until(t, time.Minute, fmt.Sprintf("KV %s's %d key groups on %s", bucket, len(want), rp), func() error {
		time.Sleep(50 * time.Millisecond) // each read is a consumer on the server
		got := map[int]uint64{}
		for _, m := range readStream(t, js, rp, 0) {
			if !strings.HasPrefix(m.Subject(), side) {
				continue
			}
			kg, _ := strconv.Atoi(strings.TrimPrefix(m.Subject(), side))
			if v, err := strconv.ParseUint(m.Headers().Get(engine.HeaderSource), 10, 64); err == nil {
				got[kg] = max(got[kg], v)
			}
		}
		for kg, w := range want {
			if got[kg] < w {
				return fmt.Errorf("key group %d forwarded through %d of %d", kg, got[kg], w)
			}
		}
		return nil
	})
}

// TestJobGraphLookupJoinKillNine runs the clicks lookup join as the cairn
// binary through three phases of table changes (puts, updates, deletes)
// and clicks, SIGKILLing it at random moments within each phase (9 times a
// case) and restarting it on random slot counts per stage; each phase's
// table changes reach the join's stream before its clicks are published,
// and its clicks are joined before the next phase's changes. Every click
// is joined with its phase's row (none: dropped), exactly once.
func TestJobGraphLookupJoinKillNine(t *testing.T) {
	forKillCases(t, 30, func(t *testing.T, c *cairnBinary, k killConfig) {
		ctx := context.Background()
		_, js := connectJS(t, k.url)
		kv := clicksInputs(t, js)
		jobFile := writeJob(t, "clicks.yaml", clicksJob(t, k.url, t.TempDir(), k.store, 2), k.mode)
		c.args = func() []string { return append([]string{"--job", jobFile}, randomSlots(k.rng, "enrich")...) }
		rows := map[string]string{}
		want := map[string]int{}
		clickN := 0
		clicks := func(n int) {
			var msgs []*nats.Msg
			for range n {
				user := fmt.Sprintf("u%d", clickN%25)
				v := fmt.Sprintf("click%d", clickN)
				clickN++
				msgs = append(msgs, &nats.Msg{Subject: "clicks.web", Header: nats.Header{engine.HeaderKey: {user}}, Data: []byte(v)})
				if row, ok := rows[user]; ok {
					want[user+"="+v+"|"+row]++
				}
			}
			publishAll(t, js, msgs)
		}
		total := func() int { return sum(want) }
		caughtUp := func() {
			wait.Until(t, 2*time.Minute, fmt.Sprintf("%d enriched clicks", total()), func() error {
				c.alive()
				if n := streamMsgs(t, js, "ENRICHED"); n < total() {
					return fmt.Errorf("%d", n)
				}
				return subTopologiesCaughtUp(c.httpAddr, 3)
			})
		}
		c.start()
		for phase := range 3 {
			for i := range 20 {
				user := fmt.Sprintf("u%d", (i+phase*7)%25)
				if k.rng.IntN(5) == 0 {
					if err := kv.Delete(ctx, user); err != nil {
						t.Fatal(err)
					}
					delete(rows, user)
					continue
				}
				row := fmt.Sprintf("name%d.p%d", i, phase)
				if _, err := kv.Put(ctx, user, []byte(row)); err != nil {
					t.Fatal(err)
				}
				rows[user] = row
			}
			// The job must be up to forward the table before the clicks.
			waitTableForwarded(t, js, "USERS", "CAIRN_RP_CLICKS_2", "cairn.rp.clicks.2.1.")
			for range 3 {
				clicks(200)
				time.Sleep(time.Duration(100+k.rng.IntN(700)) * time.Millisecond)
				c.kill()
				c.start()
			}
			// The phase's clicks are joined before the next phase's
			// table changes.
			caughtUp()
		}
		c.stop()
		out := readStream(t, js, "ENRICHED", total())
		lastValues(t, out, "enriched", 16)
		checkCounts(t, keyedValues(out), want)
		t.Logf("%d enriched clicks exact (of %d)", len(out), clickN)
	})
}

// TestJobGraphLookupJoinBootstrap: on a first start with the table's rows
// and the clicks both already stored, the table is loaded before any click
// reaches the join (cairn waits for it, as Kafka Streams fills a
// GlobalKTable first), so every click finds its row: no race between the
// two forwarders drops one.
func TestJobGraphLookupJoinBootstrap(t *testing.T) {
	url := startNATS(t)
	_, js := connectJS(t, url)
	ctx := context.Background()
	kv := clicksInputs(t, js)
	const users, n = 400, 2000
	for i := range users {
		if _, err := kv.Put(ctx, fmt.Sprintf("u%d", i), []byte(fmt.Sprintf("name%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int{}
	var msgs []*nats.Msg
	for i := range n {
		user, v := fmt.Sprintf("u%d", (i*7)%users), fmt.Sprintf("click%d", i)
		msgs = append(msgs, &nats.Msg{Subject: "clicks.web", Header: nats.Header{engine.HeaderKey: {user}}, Data: []byte(v)})
		want[user+"="+v+"|name"+strings.TrimPrefix(user, "u")]++
	}
	publishAll(t, js, msgs)

	r, stop := runJob(t, clicksJob(t, url, t.TempDir(), "file://"+t.TempDir()+"?create_dir=true", 2))
	subs := r.SubTopologies()
	wait.Until(t, time.Minute, "every click through the join", func() error {
		if got := subs[0].Engine.Stats().ProcessedSeq; got < n {
			return fmt.Errorf("clicks forwarded through %d of %d", got, n)
		}
		s, err := js.Stream(ctx, "CAIRN_RP_CLICKS_2")
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if got := subs[2].Engine.Stats().ProcessedSeq; got < info.State.LastSeq {
			return fmt.Errorf("join through %d of %d", got, info.State.LastSeq)
		}
		return nil
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	out := readStream(t, js, "ENRICHED", streamMsgs(t, js, "ENRICHED"))
	checkCounts(t, keyedValues(out), want)
}

// diagnoseTap says what the writers published on the repartition subjects
// (joinTap), for the missing pairs and the others, and dumps it to
// CAIRN_E2E_LOGDIR.
func diagnoseTap(t *testing.T, want, got map[string]int) {
	t.Helper()
	if tap := joinTap; tap != nil {
		tap.mu.Lock()
		defer tap.mu.Unlock()
		t.Logf("join diagnosis: published on the repartition subjects (a core subscription of the test, %d messages; blind while its node was down, and it misses messages under load: a pair shown as neither in PAID says how much): %s", len(tap.lines), sidesHeld(want, got, tap.records))
		if d := os.Getenv("CAIRN_E2E_LOGDIR"); d != "" {
			p := filepath.Join(d, fmt.Sprintf("rppub-%d.txt", time.Now().UnixNano()))
			if err := os.WriteFile(p, []byte(strings.Join(tap.lines, "\n")), 0o644); err == nil {
				t.Logf("join diagnosis: the messages published are in %s", p)
			}
		}
	}
}

// sidesHeld says, for the pairs missing from PAID and for those in it,
// whether records (key -> side -> records seen) held the order's record
// and its payments.
func sidesHeld(want, got map[string]int, records map[string]map[string]int) string {
	var b strings.Builder
	for _, missing := range []bool{true, false} {
		both, orderOnly, payOnly, neither := 0, 0, 0, 0
		for k, n := range want {
			if (got[k] < n) != missing {
				continue
			}
			key, _, _ := strings.Cut(k, "=")
			r := records[key]
			switch {
			case r["0"] > 0 && r["1"] > 0:
				both++
			case r["0"] > 0:
				orderOnly++
			case r["1"] > 0:
				payOnly++
			default:
				neither++
			}
		}
		what := "of the pairs in PAID"
		if missing {
			what = "of the missing pairs"
		}
		fmt.Fprintf(&b, "%s: both sides %d, the order only %d, payments only %d, neither %d; ", what, both, orderOnly, payOnly, neither)
	}
	return b.String()
}

// joinTap, while TestNATSClusterNodeKilled's join runs, records every
// message published on the join's repartition subjects.
var joinTap *rpTap

// rpTap is a core subscription's record of a repartition stream's
// subjects: what the writers sent, stored or not.
type rpTap struct {
	mu      sync.Mutex
	lines   []string
	records map[string]map[string]int
}

// tapRepartition subscribes to subject (a repartition stream's) on nc.
func tapRepartition(t *testing.T, nc *nats.Conn, subject string) *rpTap {
	t.Helper()
	tap := &rpTap{records: map[string]map[string]int{}}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		tap.mu.Lock()
		defer tap.mu.Unlock()
		h := m.Header
		tap.lines = append(tap.lines, fmt.Sprintf("%s %s out=%s marker=%s key=%s time=%s wm=%s", time.Now().Format("15:04:05.000"), m.Subject,
			h.Get(engine.HeaderOut), h.Get(engine.HeaderMarker), h.Get(engine.HeaderKey), h.Get(engine.HeaderTime), h.Get(engine.HeaderWatermark)))
		if h.Get(engine.HeaderMarker) != "" || len(m.Subject) <= len("cairn.rp.orderpay.2.") {
			return
		}
		k, side := h.Get(engine.HeaderKey), m.Subject[len("cairn.rp.orderpay.2."):][:1]
		if tap.records[k] == nil {
			tap.records[k] = map[string]int{}
		}
		tap.records[k][side]++
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	// The interest reaches the other nodes over their routes a moment
	// later: messages published there before it are not seen.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	return tap
}
