package nexmark

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func seed(t *testing.T) uint64 {
	s := rand.Uint64()
	t.Logf("seed %d", s)
	return s
}

func TestGeneratorDeterministic(t *testing.T) {
	s := seed(t)
	g1, _ := New(Config{Seed: s})
	g2, _ := New(Config{Seed: s})
	g3, _ := New(Config{Seed: s + 1})
	var a, b, c Event
	differ := 0
	for n := uint64(0); n < 2000; n++ {
		g1.Event(n, &a)
		g2.Event(n, &b)
		g3.Event(n, &c)
		if string(AppendJSON(nil, &a)) != string(AppendJSON(nil, &b)) {
			t.Fatalf("event %d differs for one seed", n)
		}
		if string(AppendJSON(nil, &a)) != string(AppendJSON(nil, &c)) {
			differ++
		}
	}
	if differ < 1900 {
		t.Fatalf("only %d of 2000 events differ between two seeds", differ)
	}
}

func TestGeneratorShape(t *testing.T) {
	g, _ := New(Config{Seed: seed(t), Rate: 1000})
	const n = 50_000
	var kinds [3]int
	var e Event
	var lastPerson, lastAuction int64 = FirstPersonID - 1, FirstAuctionID - 1
	hotAuction, hotBidder, hotSeller, bids, auctions := 0, 0, 0, 0, 0
	for i := uint64(0); i < n; i++ {
		g.Event(i, &e)
		kinds[e.Kind]++
		if want := DefaultBaseTime + int64(i); e.Time() != want {
			t.Fatalf("event %d at %d, want %d (rate 1000: one per ms)", i, e.Time(), want)
		}
		switch e.Kind {
		case KindPerson:
			if e.Person.ID != lastPerson+1 {
				t.Fatalf("person id %d after %d", e.Person.ID, lastPerson)
			}
			lastPerson = e.Person.ID
		case KindAuction:
			auctions++
			a := e.Auction
			if a.ID != lastAuction+1 {
				t.Fatalf("auction id %d after %d", a.ID, lastAuction)
			}
			lastAuction = a.ID
			if a.Category < 10 || a.Category > 14 || a.Reserve < a.InitialBid || a.Expires <= a.DateTime {
				t.Fatalf("auction %+v", a)
			}
			if a.Seller > lastPerson+personIDLead {
				t.Fatalf("seller %d beyond the last person %d and the lead", a.Seller, lastPerson)
			}
			if (a.Seller-FirstPersonID)%hotBatch == 0 {
				hotSeller++
			}
		case KindBid:
			bids++
			b := e.Bid
			if b.Price < 100 || b.Price > 100_000_000 {
				t.Fatalf("price %d", b.Price)
			}
			if b.Auction > lastAuction+auctionIDLead || b.Bidder > lastPerson+personIDLead {
				t.Fatalf("bid %+v beyond the last auction %d / person %d", b, lastAuction, lastPerson)
			}
			if (b.Auction-FirstAuctionID)%hotBatch == 0 {
				hotAuction++
			}
			if (b.Bidder-FirstPersonID)%hotBatch == 1 {
				hotBidder++
			}
		}
	}
	if kinds != [3]int{n / 50, 3 * n / 50, 46 * n / 50} {
		t.Fatalf("kinds %v, want 1:3:46", kinds)
	}
	// Hot: 1 - 1/ratio of the draws, plus the cold draws that hit a hot id.
	within := func(name string, got, of int, lo, hi float64) {
		if f := float64(got) / float64(of); f < lo || f > hi {
			t.Errorf("%s: %.3f, want in [%.2f, %.2f]", name, f, lo, hi)
		}
	}
	within("hot auctions", hotAuction, bids, 0.48, 0.56)
	within("hot bidders", hotBidder, bids, 0.73, 0.80)
	within("hot sellers", hotSeller, auctions, 0.72, 0.80)
}

func TestCodecRoundTrip(t *testing.T) {
	g, _ := New(Config{Seed: seed(t)})
	var e Event
	var v View
	for n := uint64(0); n < 500; n++ {
		g.Event(n, &e)
		b := AppendJSON(nil, &e)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("event %d: %v: %s", n, err, b)
		}
		if err := v.Decode(b); err != nil {
			t.Fatalf("event %d: %v", n, err)
		}
		if v.Kind != e.Kind || v.DateTime != e.Time() {
			t.Fatalf("event %d: decoded %v at %d", n, v.Kind, v.DateTime)
		}
		switch e.Kind {
		case KindPerson:
			if v.ID != e.Person.ID || string(v.Name) != e.Person.Name || string(v.State) != e.Person.State || string(v.Extra) != e.Person.Extra {
				t.Fatalf("person %+v decoded as %+v", e.Person, v)
			}
		case KindAuction:
			a := e.Auction
			if v.ID != a.ID || v.Seller != a.Seller || v.Category != a.Category || v.Expires != a.Expires || string(v.Description) != a.Description {
				t.Fatalf("auction %+v decoded as %+v", a, v)
			}
		case KindBid:
			b := e.Bid
			if v.Auction != b.Auction || v.Bidder != b.Bidder || v.Price != b.Price || string(v.Channel) != b.Channel || string(v.URL) != b.URL {
				t.Fatalf("bid %+v decoded as %+v", b, v)
			}
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	var v View
	for _, in := range []string{``, `[]`, `{}`, `{"id":1}`, `{"type":"car"}`, `{"type":"bid","price":}`, `{"type":"bid","url":"a\"b"}`, `{"type":"bid"`, `{"type":"bid","price":99999999999999999999}`} {
		if err := v.Decode([]byte(in)); !errors.Is(err, ErrRecord) {
			t.Errorf("Decode(%q) = %v, want ErrRecord", in, err)
		}
	}
}

func BenchmarkGenerateEncode(b *testing.B) {
	g, _ := New(Config{Seed: 1})
	var e Event
	var buf []byte
	for i := 0; i < b.N; i++ {
		g.Event(uint64(i), &e)
		buf = AppendJSON(buf[:0], &e)
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkDecodeBid is the operators' decode of a bid, native: the
// figure to hold against the guest's (docs/bench/nexmark.md).
func BenchmarkDecodeBid(b *testing.B) {
	g, _ := New(Config{Seed: 1})
	var e Event
	n := uint64(4)
	g.Event(n, &e)
	rec := AppendJSON(nil, &e)
	var v View
	b.SetBytes(int64(len(rec)))
	for i := 0; i < b.N; i++ {
		if err := v.Decode(rec); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzDecode: any bytes decode without a panic, and a bid the fast path
// takes decodes to what the general decoder makes of it.
func FuzzDecode(f *testing.F) {
	g, _ := New(Config{Seed: 2})
	var e Event
	for n := uint64(0); n < 6; n++ {
		g.Event(n, &e)
		f.Add(AppendJSON(nil, &e))
	}
	f.Add([]byte(`{"type":"bid","auction":1,"bidder":2,"price":3,"channel":"c","url":"u","date_time":4,"extra":""}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var v, w View
		err := v.Decode(b)
		if k, ok := KindOfRecord(b); ok && err == nil && k != v.Kind {
			t.Fatalf("KindOfRecord says %v, Decode %v", k, v.Kind)
		}
		if w.decodeBid(b) {
			var general View
			ok := general.decodeGeneral(b) == nil
			if !ok || general.Auction != w.Auction || general.Bidder != w.Bidder || general.Price != w.Price ||
				string(general.Channel) != string(w.Channel) || string(general.URL) != string(w.URL) ||
				general.DateTime != w.DateTime || string(general.Extra) != string(w.Extra) {
				t.Fatalf("fast %+v, general %+v (%v) of %q", w, general, ok, b)
			}
		}
	})
}

// TestPlainEveryPosition checks the string scan (eight bytes at a time,
// then byte by byte) finds the closing quote, and refuses a backslash, at
// every position around the word boundaries.
func TestPlainEveryPosition(t *testing.T) {
	for n := 0; n < 40; n++ {
		for start := 0; start < 9; start++ {
			b := make([]byte, start+n+3)
			for i := range b {
				b[i] = 'a' + byte(i%26)
			}
			b[start+n] = '"'
			s, next, ok := plain(b, start)
			if !ok || len(s) != n || next != start+n+1 {
				t.Fatalf("quote at %d from %d: %q %d %v", start+n, start, s, next, ok)
			}
			if n > 0 {
				b[start+n-1] = '\\'
				if _, _, ok := plain(b, start); ok {
					t.Fatalf("backslash at %d from %d: accepted", start+n-1, start)
				}
			}
		}
	}
	if _, _, ok := plain([]byte("abcdefghijklmnop"), 0); ok {
		t.Fatal("a string without its closing quote: accepted")
	}
}

// TestPlainStringEveryByte checks the eight-bytes-at-a-time test of the
// generator's encoder against a byte-by-byte one: every byte value, at
// every position of strings of every length around the word boundaries,
// and the output stays valid JSON that decodes back to the string.
func TestPlainStringEveryByte(t *testing.T) {
	slow := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if c := s[i]; c == '"' || c == '\\' || c < 0x20 {
				return false
			}
		}
		return true
	}
	for n := 1; n < 20; n++ {
		for pos := 0; pos < n; pos++ {
			for c := 0; c < 256; c++ {
				b := []byte(strings.Repeat("x", n))
				b[pos] = byte(c)
				if pos > 0 {
					b[pos-1] = 0xff // a high byte beside it must not hide it
				}
				s := string(b)
				if got, want := plainString(s), slow(s); got != want {
					t.Fatalf("%q: plainString %v, want %v", s, got, want)
				}
				if pos == 0 && c < 0x80 { // valid UTF-8: JSON gives it back
					var back string
					if err := json.Unmarshal(appendStr(nil, "", s), &back); err != nil || back != s {
						t.Fatalf("%q: appendStr gives %q: %v", s, appendStr(nil, "", s), err)
					}
				}
			}
		}
	}
}

// TestNum: the word-at-a-time num reads what a digit-by-digit reading
// does, for every length of number, at every offset, before every kind of
// byte that can end it.
func TestNum(t *testing.T) {
	slow := func(b []byte, i int) (int64, int, bool) {
		var n int64
		j := i
		for ; j < len(b) && j-i < 18; j++ {
			c := b[j]
			if c < '0' || c > '9' {
				break
			}
			n = n*10 + int64(c-'0')
		}
		return n, j, j > i && (j == len(b) || b[j] < '0' || b[j] > '9')
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for digits := 0; digits <= 22; digits++ {
		for _, end := range []string{"", ",", "}", "/", ":", "\x00", "\xff", "\xfa", " ", "a", ",\"price\":12"} {
			for pre := 0; pre < 3; pre++ {
				b := []byte(strings.Repeat("x", pre))
				for range digits {
					b = append(b, byte('0'+rng.IntN(10)))
				}
				b = append(b, end...)
				n, j, ok := num(b, pre)
				wn, wj, wok := slow(b, pre)
				if ok != wok || (ok && (n != wn || j != wj)) {
					t.Fatalf("num(%q, %d) = %d, %d, %v; want %d, %d, %v", b, pre, n, j, ok, wn, wj, wok)
				}
			}
		}
	}
	for _, s := range []string{"999999999999999999,", "1000000000000000000,", "000000001234,", "0,", "12345678", "123456789012345678"} {
		n, j, ok := num([]byte(s), 0)
		wn, wj, wok := slow([]byte(s), 0)
		if ok != wok || (ok && (n != wn || j != wj)) {
			t.Fatalf("num(%q) = %d, %d, %v; want %d, %d, %v", s, n, j, ok, wn, wj, wok)
		}
	}
}

// TestDecodeBidFast: the fast decode of a bid reads what the general
// decoder does, for generated bids and for bids whose numbers have every
// length from 1 to 18 digits.
func TestDecodeBidFast(t *testing.T) {
	g, _ := New(Config{Seed: 3})
	var e Event
	var recs [][]byte
	for n := uint64(0); n < 5000; n++ {
		g.Event(n, &e)
		if e.Kind == KindBid {
			recs = append(recs, AppendJSON(nil, &e))
		}
	}
	n := int64(0)
	for digits := 1; digits <= 18; digits++ {
		n = n*10 + int64(digits%10)
		recs = append(recs, fmt.Appendf(nil, `{"type":"bid","auction":%d,"bidder":%d,"price":%d,"channel":"c","url":"u","date_time":%d,"extra":""}`, n, n/3, n%1000, n))
	}
	for _, b := range recs {
		var fast, general View
		if !fast.decodeBid(b) {
			t.Fatalf("fast decode refused %s", b)
		}
		if err := general.decodeGeneral(b); err != nil {
			t.Fatal(err)
		}
		if general.Auction != fast.Auction || general.Bidder != fast.Bidder || general.Price != fast.Price ||
			string(general.Channel) != string(fast.Channel) || string(general.URL) != string(fast.URL) ||
			general.DateTime != fast.DateTime || string(general.Extra) != string(fast.Extra) || fast.Kind != KindBid {
			t.Fatalf("fast %+v, general %+v of %s", fast, general, b)
		}
	}
}
