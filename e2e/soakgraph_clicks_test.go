package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/testutil/wait"
	"cairn/state"
)

// soakGraphs are the job graphs a soak round may pick.
var soakGraphs = []string{"topwords", "orderpay", "clicks"}

// soakGraphRound runs one of soakGraphs as the cairn binary through
// SIGKILLs at random moments, restarting it each time on random slot counts
// per sub-topology, and checks its outputs exactly against the graph's
// model: the top-words chain (graphKillCase), the orders ⋈ payments interval
// join (joinKillCase), the clicks lookup join (clicksKillCase). It returns
// the SIGKILLs and the input messages.
func soakGraphRound(t *testing.T, bin, graph string, rng *rand.Rand, store, mode string) (kills, messages int) {
	url := startNATS(t)
	_, js := connectJS(t, url)
	switch graph {
	case "topwords":
		kills = graphKillCase(t, bin, url, rng, store, mode)
		return kills, streamMsgs(t, js, "LINES")
	case "orderpay":
		kills = joinKillCase(t, bin, url, rng, store, mode)
		return kills, streamMsgs(t, js, "ORDERS") + streamMsgs(t, js, "PAYMENTS")
	case "clicks":
		return clicksKillCase(t, bin, url, rng, store, mode)
	}
	t.Fatalf("no job graph %q", graph)
	return 0, 0
}

// clicksKillCase runs the clicks lookup join (clicksJob: a stream, a KV
// bucket as a table, builtin:lookup_join) as the cairn binary and SIGKILLs
// it 3-6 times: in a quarter of the runs soon after the start (in the
// restore or the first reads), otherwise while it works through the clicks
// or table changes (or both, one after the other) published in that run. Each run starts on random slot
// counts (1-4 for the forwarders, 1-4 for the join). A run publishes its
// clicks or its table changes only once everything published before is on
// the join's repartition stream, so the row each click must meet is known:
// the model is exact. At the end: every enriched click exactly once,
// nothing else, Cairn-Out gap-free on the output and on both sides of the
// repartition stream. It returns the SIGKILLs and the input messages
// (clicks and table changes).
func clicksKillCase(t *testing.T, bin, url string, rng *rand.Rand, storeKind, mode string) (kills, messages int) {
	_, js := connectJS(t, url)
	kv := clicksInputs(t, js)
	c := &cairnBinary{t: t, bin: bin}
	var store string
	store, c.env = killStore(t, storeKind)
	jobFile := writeJob(t, "clicks.yaml", clicksJob(t, url, t.TempDir(), store, 2), mode)
	c.args = func() []string { return append([]string{"--job", jobFile}, randomSlots(rng, "enrich")...) }
	m := newClicksModel(t, js, kv, rng)

	for i := range 20 {
		m.put(fmt.Sprintf("u%d", i))
	}
	kills = 3 + rng.IntN(4)
	inFlight := 0 // kills before the join had emitted every output due
	for range kills {
		c.start()
		alive := c.alive
		if rng.IntN(4) == 0 {
			time.Sleep(time.Duration(30+rng.IntN(600)) * time.Millisecond)
		} else {
			// The kill lands while the forwarders and the join work
			// through what this run published, or soon after.
			m.settle(alive)
			switch rng.IntN(3) {
			case 0: // table changes
				m.changeTable(3 + rng.IntN(10))
				time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
			case 1: // clicks
				m.clicks(500 + rng.IntN(2500))
				time.Sleep(time.Duration(rng.IntN(250)) * time.Millisecond)
			case 2: // clicks, then table changes once they are forwarded
				m.clicks(500 + rng.IntN(2500))
				m.settle(alive)
				m.changeTable(3 + rng.IntN(10))
				time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
			}
		}
		alive()
		if streamMsgs(t, js, "ENRICHED") < m.outputs() {
			inFlight++
		}
		c.kill()
	}
	c.start()
	m.settle(c.alive)
	m.clicks(300)
	total := m.outputs()
	wait.Until(t, 2*time.Minute, fmt.Sprintf("%d enriched clicks", total), func() error {
		c.alive()
		if n := streamMsgs(t, js, "ENRICHED"); n < total {
			return fmt.Errorf("%d outputs", n)
		}
		return subTopologiesCaughtUp(c.httpAddr, 3)
	})
	c.stop()
	if err := m.forwarded(true); err != nil {
		t.Error(err)
	}
	checkEnriched(t, js, m.want)
	rp := readStream(t, js, "CAIRN_RP_CLICKS_2", 0)
	markers := checkRepartition(t, rp)
	t.Logf("%d clicks, %d table changes, %d SIGKILLs (%d before the join's outputs were all out); repartition stream: %d messages left (%d markers)",
		m.clickN, m.tableOps, kills, inFlight, len(rp), markers)
	return kills, m.clickN + m.tableOps
}

// clicksModel is the lookup join's model: the table's rows as they are now
// (each put a new value), and for every click published the output it must
// produce (its user's row when it was published; none: dropped). It also
// keeps, per key group of the join, how many clicks went to it and the
// last KV sequence of its users' entries: what the repartition stream must
// hold before the next click or table change is published.
type clicksModel struct {
	t       *testing.T
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	rng     *rand.Rand
	rows    map[string]string
	want    map[string]int
	version int

	clickN, tableOps int
	clicksPerKG      map[int]uint64 // key group -> clicks published
	tableSeqPerKG    map[int]uint64 // key group -> its users' last KV sequence
}

const clicksKeyGroups, clicksUsers = 16, 30

func newClicksModel(t *testing.T, js jetstream.JetStream, kv jetstream.KeyValue, rng *rand.Rand) *clicksModel {
	return &clicksModel{t: t, js: js, kv: kv, rng: rng, rows: map[string]string{}, want: map[string]int{},
		clicksPerKG: map[int]uint64{}, tableSeqPerKG: map[int]uint64{}}
}

func clicksKG(user string) int { return state.KeyGroup([]byte(user), clicksKeyGroups) }

func (m *clicksModel) put(user string) {
	m.version++
	row := fmt.Sprintf("name.%s.v%d", user, m.version)
	rev, err := m.kv.Put(context.Background(), user, []byte(row))
	if err != nil {
		m.t.Fatal(err)
	}
	m.rows[user] = row
	m.tableSeqPerKG[clicksKG(user)] = rev
	m.tableOps++
}

func (m *clicksModel) del(user string) {
	ctx := context.Background()
	if err := m.kv.Delete(ctx, user); err != nil {
		m.t.Fatal(err)
	}
	// The bucket has one writer, this model: its stream's last sequence is
	// the delete's.
	st, err := m.js.Stream(ctx, "KV_USERS")
	if err != nil {
		m.t.Fatal(err)
	}
	delete(m.rows, user)
	m.tableSeqPerKG[clicksKG(user)] = st.CachedInfo().State.LastSeq
	m.tableOps++
}

// changeTable makes n changes: puts (new users too) and deletes.
func (m *clicksModel) changeTable(n int) {
	for range n {
		user := fmt.Sprintf("u%d", m.rng.IntN(clicksUsers))
		if _, ok := m.rows[user]; ok && m.rng.IntN(3) == 0 {
			m.del(user)
		} else {
			m.put(user)
		}
	}
}

// clicks publishes n clicks of random users.
func (m *clicksModel) clicks(n int) {
	var msgs []*nats.Msg
	for range n {
		user := fmt.Sprintf("u%d", m.rng.IntN(clicksUsers))
		v := fmt.Sprintf("click%d", m.clickN)
		m.clickN++
		m.clicksPerKG[clicksKG(user)]++
		msgs = append(msgs, &nats.Msg{Subject: "clicks.web", Header: nats.Header{engine.HeaderKey: {user}}, Data: []byte(v)})
		if row, ok := m.rows[user]; ok {
			m.want[user+"="+v+"|"+row]++
		}
	}
	publishAll(m.t, m.js, msgs)
}

func (m *clicksModel) outputs() int {
	n := 0
	for _, c := range m.want {
		n += c
	}
	return n
}

// settle waits, with the job running (alive fails the test if it died),
// until every click and table change published so far is on the join's
// repartition stream: per key group, the last message of the clicks side
// carries the key group's click count as its Cairn-Out (a marker carries
// the last output's), and the last of the table side a Cairn-Src at or
// after the key group's last KV sequence. Each key group subject keeps its
// last message through the purges.
func (m *clicksModel) settle(alive func()) {
	wait.Until(m.t, 2*time.Minute, "every click and table change so far on the repartition stream", func() error {
		alive()
		time.Sleep(20 * time.Millisecond)
		return m.forwarded(false)
	})
}

// forwarded checks the repartition stream's last message of each key
// group subject against what was published (see settle); exact, the
// clicks side's Cairn-Out must equal each key group's click count (one
// output per click, none twice).
func (m *clicksModel) forwarded(exact bool) error {
	ctx := context.Background()
	st, err := m.js.Stream(ctx, "CAIRN_RP_CLICKS_2")
	if err != nil {
		return err
	}
	last := func(side int, kg int, header string) (uint64, error) {
		msg, err := st.GetLastMsgForSubject(ctx, fmt.Sprintf("cairn.rp.clicks.2.%d.%d", side, kg))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		return strconv.ParseUint(msg.Header.Get(header), 10, 64)
	}
	for kg, n := range m.clicksPerKG {
		got, err := last(0, kg, engine.HeaderOut)
		if err != nil {
			return err
		}
		if got < n || exact && got != n {
			return fmt.Errorf("key group %d: %d outputs of the clicks' forwarder, %d clicks", kg, got, n)
		}
	}
	for kg, seq := range m.tableSeqPerKG {
		got, err := last(1, kg, engine.HeaderSource)
		if err != nil {
			return err
		}
		if got < seq {
			return fmt.Errorf("key group %d: table forwarded up to KV sequence %d, want %d", kg, got, seq)
		}
	}
	return nil
}

// checkEnriched reads ENRICHED and compares it with the lookup join's
// model: every enriched click exactly once, nothing else, Cairn-Out
// gap-free per key group subject.
func checkEnriched(t *testing.T, js jetstream.JetStream, want map[string]int) {
	t.Helper()
	n := 0
	for _, c := range want {
		n += c
	}
	out := readStream(t, js, "ENRICHED", n)
	lastValues(t, out, "enriched", clicksKeyGroups)
	got := map[string]int{}
	for _, m := range out {
		got[m.Headers().Get(engine.HeaderKey)+"="+string(m.Data())]++
	}
	for k, c := range want {
		if got[k] != c {
			t.Errorf("%s: emitted %d times, want %d", k, got[k], c)
		}
	}
	for k, c := range got {
		if want[k] == 0 {
			t.Errorf("%s: emitted %d times, not the model's", k, c)
		}
	}
	t.Logf("%d enriched clicks exact", len(out))
}
