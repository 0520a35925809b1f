package nexmark

import (
	"math"
	"math/bits"
	"strconv"
	"unsafe"
)

// The constants of the Nexmark specification, as Flink's generator has
// them (GeneratorConfig, NexmarkConfiguration's defaults).
const (
	// FirstPersonID and FirstAuctionID start the ids high, so queries that
	// filter on small ids still find matches.
	FirstPersonID   = 1000
	FirstAuctionID  = 1000
	FirstCategoryID = 10

	personProportion  = 1
	auctionProportion = 3
	bidProportion     = 46
	totalProportion   = personProportion + auctionProportion + bidProportion

	numCategories       = 5
	numActivePeople     = 1000
	numInFlightAuctions = 100
	personIDLead        = 10
	auctionIDLead       = 10

	// A hot auction, bidder or seller is drawn with probability
	// 1 - 1/ratio; it is then the first (for a bidder: second) of the last
	// batch of hotBatch ids.
	hotAuctionRatio = 2
	hotBiddersRatio = 4
	hotSellersRatio = 4
	hotBatch        = 100

	hotChannelsRatio = 2
	channelsNumber   = 10_000

	avgPersonBytes  = 200
	avgAuctionBytes = 500
	avgBidBytes     = 100
)

// Kind is the type of an event.
type Kind uint8

// The event kinds.
const (
	KindPerson Kind = iota
	KindAuction
	KindBid
)

func (k Kind) String() string {
	switch k {
	case KindPerson:
		return "person"
	case KindAuction:
		return "auction"
	case KindBid:
		return "bid"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Person is a new user of the auction site.
type Person struct {
	ID           int64
	Name         string
	EmailAddress string
	CreditCard   string
	City         string
	State        string
	DateTime     int64 // Unix ms
	Extra        string
}

// Auction is an item put up for auction by a seller (a person).
type Auction struct {
	ID          int64
	ItemName    string
	Description string
	InitialBid  int64
	Reserve     int64
	DateTime    int64 // Unix ms
	Expires     int64 // Unix ms
	Seller      int64
	Category    int64
	Extra       string
}

// Bid is a bid of a person (the bidder) on an auction.
type Bid struct {
	Auction  int64
	Bidder   int64
	Price    int64 // cents
	Channel  string
	URL      string
	DateTime int64 // Unix ms
	Extra    string
}

// Event is one event: Kind says which of Person, Auction and Bid is set.
type Event struct {
	Kind    Kind
	Person  Person
	Auction Auction
	Bid     Bid
}

// Time is the event's time, Unix ms.
func (e *Event) Time() int64 {
	switch e.Kind {
	case KindPerson:
		return e.Person.DateTime
	case KindAuction:
		return e.Auction.DateTime
	}
	return e.Bid.DateTime
}

// Key is the event's record key: a person's id, an auction's id, a bid's
// auction.
func (e *Event) Key() int64 {
	switch e.Kind {
	case KindPerson:
		return e.Person.ID
	case KindAuction:
		return e.Auction.ID
	}
	return e.Bid.Auction
}

// Generator generates the events of a Config. It is safe for concurrent use:
// it holds no state besides the configuration and derived tables.
type Generator struct {
	cfg     Config
	hotURLs [len(hotChannels)]string
	// channels are the cold channels' names and URLs, made once (Flink
	// caches them too).
	channels [channelsNumber][2]string
}

var (
	usStates   = []string{"AZ", "CA", "ID", "OR", "WA", "WY"}
	usCities   = []string{"Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"}
	firstNames = []string{"Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"}
	lastNames  = []string{"Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"}

	hotChannels = [...]string{"Google", "Facebook", "Baidu", "Apple"}
)

// New returns the generator of cfg (its defaults set).
func New(cfg Config) (*Generator, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &Generator{cfg: cfg}
	for i := range g.hotURLs {
		r := newRNG(cfg.Seed, math.MaxUint64-uint64(i))
		g.hotURLs[i] = baseURL(&r)
	}
	for c := range g.channels {
		g.channels[c][0], g.channels[c][1] = g.channel(c)
	}
	return g, nil
}

// Config is the generator's configuration, defaults set.
func (g *Generator) Config() Config { return g.cfg }

// KindOf is the kind of event n: the first of every 50 is a person, the
// next three auctions, the rest bids.
func KindOf(n uint64) Kind {
	switch r := n % totalProportion; {
	case r < personProportion:
		return KindPerson
	case r < personProportion+auctionProportion:
		return KindAuction
	}
	return KindBid
}

// Event generates event n (0-based) into e.
func (g *Generator) Event(n uint64, e *Event) {
	r := newRNG(g.cfg.Seed, n)
	ts := g.cfg.Time(n)
	e.Kind = KindOf(n)
	switch e.Kind {
	case KindPerson:
		g.person(n, &r, ts, &e.Person)
	case KindAuction:
		g.auction(n, &r, ts, &e.Auction)
	default:
		g.bid(n, &r, ts, &e.Bid)
	}
}

func (g *Generator) person(n uint64, r *rng, ts int64, p *Person) {
	p.ID = lastPersonID(n) + FirstPersonID
	p.Name = firstNames[r.intn(len(firstNames))] + " " + lastNames[r.intn(len(lastNames))]
	p.EmailAddress = nextString(r, 7) + "@" + nextString(r, 5) + ".com"
	var cc []byte
	for i := range 4 {
		if i > 0 {
			cc = append(cc, ' ')
		}
		v := r.intn(10000)
		cc = append(cc, byte('0'+v/1000), byte('0'+v/100%10), byte('0'+v/10%10), byte('0'+v%10))
	}
	p.CreditCard = string(cc)
	p.City = usCities[r.intn(len(usCities))]
	p.State = usStates[r.intn(len(usStates))]
	p.DateTime = ts
	size := 8 + len(p.Name) + len(p.EmailAddress) + len(p.CreditCard) + len(p.City) + len(p.State)
	p.Extra = nextExtra(r, size, avgPersonBytes)
}

func (g *Generator) auction(n uint64, r *rng, ts int64, a *Auction) {
	a.ID = lastAuctionID(n) + FirstAuctionID
	if r.intn(hotSellersRatio) > 0 {
		a.Seller = (lastPersonID(n) / hotBatch) * hotBatch
	} else {
		a.Seller = nextPersonID(n, r)
	}
	a.Seller += FirstPersonID
	a.Category = FirstCategoryID + int64(r.intn(numCategories))
	a.InitialBid = nextPrice(r)
	// An auction lasts on average as long as the generator takes to put up
	// numInFlightAuctions more (Flink's nextAuctionLengthMs).
	horizon := g.cfg.Time(n+numInFlightAuctions*totalProportion/auctionProportion) - ts
	a.Expires = ts + 1 + r.int63n(max(horizon*2, 1))
	a.ItemName = nextString(r, 20)
	a.Description = nextString(r, 100)
	a.Reserve = a.InitialBid + nextPrice(r)
	a.DateTime = ts
	size := 8 + len(a.ItemName) + len(a.Description) + 8 + 8 + 8 + 8 + 8
	a.Extra = nextExtra(r, size, avgAuctionBytes)
}

func (g *Generator) bid(n uint64, r *rng, ts int64, b *Bid) {
	if r.intn(hotAuctionRatio) > 0 {
		b.Auction = (lastAuctionID(n) / hotBatch) * hotBatch
	} else {
		b.Auction = nextAuctionID(n, r)
	}
	b.Auction += FirstAuctionID
	if r.intn(hotBiddersRatio) > 0 {
		// The second of the batch, so hot bidders and hot sellers differ.
		b.Bidder = (lastPersonID(n)/hotBatch)*hotBatch + 1
	} else {
		b.Bidder = nextPersonID(n, r)
	}
	b.Bidder += FirstPersonID
	b.Price = nextPrice(r)
	if r.intn(hotChannelsRatio) > 0 {
		i := r.intn(len(hotChannels))
		b.Channel, b.URL = hotChannels[i], g.hotURLs[i]
	} else {
		c := &g.channels[r.intn(channelsNumber)]
		b.Channel, b.URL = c[0], c[1]
	}
	b.DateTime = ts
	b.Extra = nextExtra(r, 8+8+8+8, avgBidBytes)
}

// channel is the name and URL of channel c: a function of the seed and c,
// as Flink's cache of channels makes them one per number within a run.
func (g *Generator) channel(c int) (string, string) {
	r := newRNG(g.cfg.Seed, math.MaxUint64/2+uint64(c))
	url := baseURL(&r)
	if r.intn(10) > 0 {
		url += "&channel_id=" + strconv.FormatInt(int64(abs32(int32(bits.Reverse32(uint32(c))))), 10)
	}
	return "channel-" + strconv.Itoa(c), url
}

func abs32(v int32) int64 {
	if v < 0 {
		return -int64(v)
	}
	return int64(v)
}

func baseURL(r *rng) string {
	return "https://www.nexmark.com/" + nextStringSep(r, 5, '_') + "/" + nextStringSep(r, 5, '_') + "/" + nextStringSep(r, 5, '_') + "/item.htm?query=1"
}

// lastPersonID is the last person id (base 0) generated by event n,
// including n itself.
func lastPersonID(n uint64) int64 {
	epoch, offset := int64(n/totalProportion), int64(n%totalProportion)
	if offset >= personProportion {
		offset = personProportion - 1
	}
	return epoch*personProportion + offset
}

// lastAuctionID is the last auction id (base 0) generated by event n,
// including n itself (-1 before the first).
func lastAuctionID(n uint64) int64 {
	epoch, offset := int64(n/totalProportion), int64(n%totalProportion)
	switch {
	case offset < personProportion:
		epoch--
		offset = auctionProportion - 1
	case offset >= personProportion+auctionProportion:
		offset = auctionProportion - 1
	default:
		offset -= personProportion
	}
	return epoch*auctionProportion + offset
}

// nextPersonID is a random person among the active ones, plus a few not
// yet created (base 0).
func nextPersonID(n uint64, r *rng) int64 {
	people := lastPersonID(n) + 1
	active := min(people, numActivePeople)
	return people - active + r.int63n(active+personIDLead)
}

// nextAuctionID is a random auction among those likely still open, plus a
// few not yet created (base 0).
func nextAuctionID(n uint64, r *rng) int64 {
	maxID := lastAuctionID(n)
	minID := max(maxID-numInFlightAuctions, 0)
	return minID + r.int63n(maxID-minID+1+auctionIDLead)
}

// nextPrice is a price in cents, log-uniform from 1.00 to 1,000,000.00.
func nextPrice(r *rng) int64 {
	return int64(math.Round(math.Pow(10, r.float64()*6) * 100))
}

// nextString is a string of 3 to maxLen-1 letters and spaces, trimmed.
func nextString(r *rng, maxLen int) string { return nextStringSep(r, maxLen, ' ') }

func nextStringSep(r *rng, maxLen int, sep byte) string {
	n := 3 + r.intn(maxLen-3)
	b := make([]byte, n)
	for i := range b {
		if r.intn(13) == 0 {
			b[i] = sep
		} else {
			b[i] = byte('a' + r.intn(26))
		}
	}
	s := string(b)
	if sep == ' ' {
		for len(s) > 0 && s[0] == ' ' {
			s = s[1:]
		}
		for len(s) > 0 && s[len(s)-1] == ' ' {
			s = s[:len(s)-1]
		}
	}
	return s
}

// nextExtra pads an event to an average size: a string of letters whose
// length makes size + length avg on average (±20%).
func nextExtra(r *rng, size, avg int) string {
	if size > avg {
		return ""
	}
	avg -= size
	delta := int(math.Round(float64(avg) * 0.2))
	n := avg - delta
	if delta > 0 {
		n += r.intn(2 * delta)
	}
	if n <= 0 {
		return ""
	}
	b := make([]byte, n)
	var v uint64
	left := 0
	for i := range b {
		if left == 0 {
			v, left = r.next(), 13 // 26^13 < 2^64
		}
		b[i] = byte('a' + v%26)
		v /= 26
		left--
	}
	// b is not written again: the string shares it rather than copy it.
	return unsafe.String(&b[0], n)
}

// rng is SplitMix64 over a state derived from the seed and a stream number:
// cheap to create per event, with no allocation.
type rng struct{ s uint64 }

func newRNG(seed, stream uint64) rng {
	r := rng{s: seed ^ (stream * 0x9e3779b97f4a7c15)}
	r.s = r.next() ^ stream
	return r
}

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn is uniform in [0, n) (Lemire's multiply-shift; the bias is below
// 2^-32 for the small n used here).
func (r *rng) intn(n int) int {
	hi, _ := bits.Mul64(r.next(), uint64(n))
	return int(hi)
}

func (r *rng) int63n(n int64) int64 {
	hi, _ := bits.Mul64(r.next(), uint64(n))
	return int64(hi)
}

func (r *rng) float64() float64 { return float64(r.next()>>11) / (1 << 53) }
