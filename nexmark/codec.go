package nexmark

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"strconv"
)

// ErrRecord is returned for a record that is not a Nexmark event in the
// format AppendJSON writes.
var ErrRecord = errors.New("nexmark: malformed record")

// AppendJSON appends the event as one JSON object: "type" first ("person",
// "auction" or "bid"), then the fields in snake case as Flink's Nexmark
// tables name them (date_time and expires in Unix ms).
func AppendJSON(b []byte, e *Event) []byte {
	switch e.Kind {
	case KindPerson:
		p := &e.Person
		b = append(b, `{"type":"person","id":`...)
		b = strconv.AppendInt(b, p.ID, 10)
		b = appendStr(b, `,"name":`, p.Name)
		b = appendStr(b, `,"email_address":`, p.EmailAddress)
		b = appendStr(b, `,"credit_card":`, p.CreditCard)
		b = appendStr(b, `,"city":`, p.City)
		b = appendStr(b, `,"state":`, p.State)
		b = appendInt(b, `,"date_time":`, p.DateTime)
		b = appendStr(b, `,"extra":`, p.Extra)
	case KindAuction:
		a := &e.Auction
		b = append(b, `{"type":"auction","id":`...)
		b = strconv.AppendInt(b, a.ID, 10)
		b = appendStr(b, `,"item_name":`, a.ItemName)
		b = appendStr(b, `,"description":`, a.Description)
		b = appendInt(b, `,"initial_bid":`, a.InitialBid)
		b = appendInt(b, `,"reserve":`, a.Reserve)
		b = appendInt(b, `,"date_time":`, a.DateTime)
		b = appendInt(b, `,"expires":`, a.Expires)
		b = appendInt(b, `,"seller":`, a.Seller)
		b = appendInt(b, `,"category":`, a.Category)
		b = appendStr(b, `,"extra":`, a.Extra)
	default:
		d := &e.Bid
		b = append(b, `{"type":"bid","auction":`...)
		b = strconv.AppendInt(b, d.Auction, 10)
		b = appendInt(b, `,"bidder":`, d.Bidder)
		b = appendInt(b, `,"price":`, d.Price)
		b = appendStr(b, `,"channel":`, d.Channel)
		b = appendStr(b, `,"url":`, d.URL)
		b = appendInt(b, `,"date_time":`, d.DateTime)
		b = appendStr(b, `,"extra":`, d.Extra)
	}
	return append(b, '}')
}

func appendInt(b []byte, name string, v int64) []byte {
	return strconv.AppendInt(append(b, name...), v, 10)
}

// appendStr appends name and s as a JSON string. The generator's strings
// are printable ASCII without quotes or backslashes; anything else is
// escaped all the same, so the output is always valid JSON.
func appendStr(b []byte, name, s string) []byte {
	b = append(b, name...)
	b = append(b, '"')
	if plainString(s) {
		return append(append(b, s...), '"')
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, `\u00`...)
			b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// plainString reports whether s has nothing JSON escapes. It tests eight
// bytes at a time: the generator writes a few hundred bytes of strings per
// event (the extra padding above all), and a test per byte was the largest
// part of encoding an event.
func plainString(s string) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		q := w ^ ('"' * ones)   // a zero byte where w has a quote
		bs := w ^ ('\\' * ones) // a zero byte where w has a backslash
		// A high bit set in a byte of the result: that byte of w is below
		// 0x20 (the first term), a quote or a backslash (the others).
		if ((w-0x20*ones)&^w|(q-ones)&^q|(bs-ones)&^bs)&highs != 0 {
			return false
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' || c < 0x20 {
			return false
		}
	}
	return true
}

// View is a decoded event whose strings point into the record it was
// decoded from: an operator decodes every record into one View without
// allocating. Fields of the other kinds are zero.
type View struct {
	Kind Kind
	// Person and auction id.
	ID int64
	// Person.
	Name, EmailAddress, CreditCard, City, State []byte
	// Auction.
	ItemName, Description                          []byte
	InitialBid, Reserve, Expires, Seller, Category int64
	// Bid.
	Auction, Bidder, Price int64
	Channel, URL           []byte
	// All kinds.
	DateTime int64
	Extra    []byte
}

// Decode decodes a record written by AppendJSON into v. Strings with
// escapes are refused (AppendJSON writes none for generated events), as is
// anything that is not a flat object of integers and strings.
func (v *View) Decode(b []byte) error {
	*v = View{}
	if v.decodeBid(b) {
		return nil
	}
	return v.decodeGeneral(b)
}

// decodeGeneral decodes any flat object of integers and strings.
func (v *View) decodeGeneral(b []byte) error {
	*v = View{}
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return errRecord("not a JSON object", i)
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return errRecord(`no "type"`, i)
	}
	sawType := false
	for {
		name, j, err := str(b, i)
		if err != nil {
			return err
		}
		j = skipSpace(b, j)
		if j >= len(b) || b[j] != ':' {
			return errRecord("':' expected", j)
		}
		j = skipSpace(b, j+1)
		if j >= len(b) {
			return errRecord("value expected", j)
		}
		if b[j] == '"' {
			s, k, err := str(b, j)
			if err != nil {
				return err
			}
			if string(name) == "type" {
				switch string(s) {
				case "person":
					v.Kind = KindPerson
				case "auction":
					v.Kind = KindAuction
				case "bid":
					v.Kind = KindBid
				default:
					return errRecord("unknown type "+strconv.Quote(string(s)), j)
				}
				sawType = true
			} else if f := v.strField(name); f != nil {
				*f = s
			}
			j = k
		} else {
			n, k, err := integer(b, j)
			if err != nil {
				return err
			}
			if f := v.intField(name); f != nil {
				*f = n
			}
			j = k
		}
		j = skipSpace(b, j)
		if j >= len(b) {
			return errRecord("unterminated object", j)
		}
		if b[j] == '}' {
			break
		}
		if b[j] != ',' {
			return errRecord("',' or '}' expected", j)
		}
		i = skipSpace(b, j+1)
	}
	if !sawType {
		return errRecord(`no "type"`, 0)
	}
	return nil
}

func (v *View) strField(name []byte) *[]byte {
	switch string(name) {
	case "name":
		return &v.Name
	case "email_address":
		return &v.EmailAddress
	case "credit_card":
		return &v.CreditCard
	case "city":
		return &v.City
	case "state":
		return &v.State
	case "item_name":
		return &v.ItemName
	case "description":
		return &v.Description
	case "channel":
		return &v.Channel
	case "url":
		return &v.URL
	case "extra":
		return &v.Extra
	}
	return nil
}

func (v *View) intField(name []byte) *int64 {
	switch string(name) {
	case "id":
		return &v.ID
	case "initial_bid":
		return &v.InitialBid
	case "reserve":
		return &v.Reserve
	case "expires":
		return &v.Expires
	case "seller":
		return &v.Seller
	case "category":
		return &v.Category
	case "auction":
		return &v.Auction
	case "bidder":
		return &v.Bidder
	case "price":
		return &v.Price
	case "date_time":
		return &v.DateTime
	}
	return nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// str reads the JSON string at b[i] (a quote) and returns its bytes and
// the index after its closing quote.
func str(b []byte, i int) ([]byte, int, error) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, errRecord("string expected", i)
	}
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '"':
			return b[i+1 : j], j + 1, nil
		case '\\':
			return nil, j, errRecord("escaped strings are not supported", j)
		}
	}
	return nil, len(b), errRecord("unterminated string", i)
}

func integer(b []byte, i int) (int64, int, error) {
	j := i
	if j < len(b) && b[j] == '-' {
		j++
	}
	start := j
	var n int64
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		if n > (1<<63-1-9)/10 {
			return 0, j, errRecord("integer out of range", i)
		}
		n = n*10 + int64(b[j]-'0')
		j++
	}
	if j == start {
		return 0, j, errRecord("integer or string expected", i)
	}
	if b[i] == '-' {
		n = -n
	}
	return n, j, nil
}

func errRecord(what string, at int) error {
	return &RecordError{What: what, Offset: at}
}

// RecordError says what is wrong with a record and where; it matches
// ErrRecord with errors.Is.
type RecordError struct {
	What   string
	Offset int
}

func (e *RecordError) Error() string {
	return "nexmark: malformed record at byte " + strconv.Itoa(e.Offset) + ": " + e.What
}

// Is makes errors.Is(err, ErrRecord) true.
func (e *RecordError) Is(target error) bool { return target == ErrRecord }

// KindOfRecord tells the kind of a record AppendJSON wrote from its first
// bytes, without decoding it; ok is false for anything else.
func KindOfRecord(b []byte) (k Kind, ok bool) {
	const p = `{"type":"`
	if len(b) < len(p)+4 || string(b[:len(p)]) != p {
		return 0, false
	}
	switch b[len(p)] {
	case 'b':
		return KindBid, string(b[len(p):len(p)+4]) == `bid"`
	case 'p':
		return KindPerson, len(b) > len(p)+7 && string(b[len(p):len(p)+7]) == `person"`
	case 'a':
		return KindAuction, len(b) > len(p)+8 && string(b[len(p):len(p)+8]) == `auction"`
	}
	return 0, false
}

// decodeBid decodes a bid in exactly AppendJSON's layout, field by field
// at known places, without looking field names up: nine bids in ten
// events go this way (an operator's decode is its largest cost in a
// WebAssembly guest). false: not that layout; Decode then takes the
// general way.
func (v *View) decodeBid(b []byte) bool {
	// One loop over the fields, so that the literal's compare is written
	// once and inline: a call is dear in a WebAssembly guest (Go's calls
	// there keep their own stack in memory), and a bid has seven literals.
	var nums [4]int64
	var strs [3][]byte
	i := 0
	le := binary.LittleEndian
	for f := range bidFields {
		l := &bidFields[f]
		j := i + l.n
		if j > len(b) || le.Uint64(b[i:]) != l.w0 || le.Uint64(b[j-8:]) != l.w2 || (l.n > 16 && le.Uint64(b[i+8:]) != l.w1) {
			return false
		}
		var ok bool
		switch {
		case l.str:
			strs[l.slot], i, ok = plain(b, j)
		case j+16 <= len(b):
			// num's words, inline: up to 16 digits and the byte after.
			w := le.Uint64(b[j:])
			if k := leadingDigits(w); k > 0 && k < 8 {
				nums[l.slot], i, ok = int64(digits8(w<<(64-8*k))), j+k, true
				break
			} else if k == 8 {
				w2 := le.Uint64(b[j+8:])
				if k2 := leadingDigits(w2); k2 < 8 {
					nums[l.slot], i, ok = int64(digits8(w)*pow10[k2]+digits8(w2<<(64-8*k2))), j+8+k2, true
					break
				}
			}
			nums[l.slot], i, ok = num(b, j)
		default:
			nums[l.slot], i, ok = num(b, j)
		}
		if !ok {
			return false
		}
	}
	if i != len(b)-1 || b[i] != '}' {
		return false
	}
	v.Kind = KindBid
	v.Auction, v.Bidder, v.Price, v.DateTime = nums[0], nums[1], nums[2], nums[3]
	v.Channel, v.URL, v.Extra = strs[0], strs[1], strs[2]
	return true
}

// bidField is a field of a bid in AppendJSON's layout: the literal before
// its value, and where decodeBid puts the value.
type bidField struct {
	word8
	str  bool // a string (else a number)
	slot int  // its index among the numbers or the strings
}

var bidFields = [...]bidField{
	{newWord8(`{"type":"bid","auction":`), false, 0},
	{newWord8(`,"bidder":`), false, 1},
	{newWord8(`,"price":`), false, 2},
	{newWord8(`,"channel":"`), true, 0},
	{newWord8(`,"url":"`), true, 1},
	{newWord8(`,"date_time":`), false, 3},
	{newWord8(`,"extra":"`), true, 2},
}

// DecodeBid decodes b into v if it is a bid in exactly AppendJSON's layout
// (the way nine events in ten take) and reports whether it was; it sets
// the bid's fields and Kind only. false: b is another event, or a bid in
// another layout, or not an event: Decode tells which.
func (v *View) DecodeBid(b []byte) bool { return v.decodeBid(b) }

// word8 is a literal of 8 to 24 bytes that decodeBid expects, as the
// little-endian words at offsets 0, 8 and len-8 (those may overlap): three
// word compares, where comparing the strings is a call of the runtime's
// byte-wise memequal in a WebAssembly guest.
type word8 struct {
	n          int
	w0, w1, w2 uint64
}

func newWord8(s string) word8 {
	if len(s) < 8 || len(s) > 24 {
		panic("nexmark: word8 literal of " + strconv.Itoa(len(s)) + " bytes")
	}
	le := binary.LittleEndian
	w1 := le.Uint64([]byte(s[len(s)-8:]))
	if len(s) > 16 {
		w1 = le.Uint64([]byte(s[8:]))
	}
	return word8{n: len(s), w0: le.Uint64([]byte(s)), w1: w1, w2: le.Uint64([]byte(s[len(s)-8:]))}
}

// num reads a non-negative decimal integer of at most 18 digits at i.
//
// It takes the digits eight at a time (SWAR, as plain does): in the
// operators' WebAssembly guest each byte of a loop costs its dispatch, and
// a bid's four numbers have 4 to 13 digits.
func num(b []byte, i int) (int64, int, bool) {
	var n uint64
	j := i
	for j+8 <= len(b) && j-i < 18 {
		w := binary.LittleEndian.Uint64(b[j:])
		k := leadingDigits(w)
		if k == 0 {
			break
		}
		n = n*pow10[k] + digits8(w<<(64-8*k))
		j += k
		if k < 8 {
			// A non-digit ends the number.
			return int64(n), j, j-i <= 18
		}
	}
	for ; j < len(b) && j-i < 18; j++ {
		c := b[j]
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + uint64(c-'0')
	}
	return int64(n), j, j > i && j-i <= 18 && (j == len(b) || b[j] < '0' || b[j] > '9')
}

// pow10[k] is 10^k.
var pow10 = [9]uint64{1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000}

// leadingDigits is how many of w's bytes, from its lowest (the first in
// memory), are ASCII digits before the first one that is not. A byte is a
// digit when its high nibble is 3 and adding 6 leaves it so (no carry
// crosses bytes for bytes below 0xfa, and one that would is no digit:
// its high nibble is not 3 either way).
func leadingDigits(w uint64) int {
	const hi, three, six = 0xf0f0f0f0f0f0f0f0, 0x3030303030303030, 0x0606060606060606
	d := (w&hi ^ three) | ((w+six)&hi ^ three) // zero bytes: digits
	m := (d | d<<1 | d<<2 | d<<3) & 0x8080808080808080
	return bits.TrailingZeros64(m) >> 3 // 8 when m is 0
}

// digits8 is the number the eight ASCII digits of w spell, its lowest
// byte the first digit; bytes of zero (not '0') lead as zeros.
func digits8(w uint64) uint64 {
	w = (w & 0x0f0f0f0f0f0f0f0f) * (10<<8 + 1) >> 8         // pairs: 10a+b in every other byte
	w = (w & 0x00ff00ff00ff00ff) * (100<<16 + 1) >> 16      // fours, in every other half-word
	return (w & 0x0000ffff0000ffff) * (10000<<32 + 1) >> 32 // the eight
}

// plain reads a string's bytes up to its closing quote (the opening one is
// before i) and returns the index after the quote; false on a backslash.
//
// It steps over eight bytes at a time while none of them is a quote or a
// backslash (a word test, SWAR): the operators run this decode in a
// WebAssembly guest, where each iteration of a byte loop costs its
// dispatch, and the url and extra strings are most of a bid's bytes.
//
// For a word w and a byte c, x = w ^ c×0x01..01 has a zero byte where w
// has c, and (x - 0x01..01) &^ x & 0x80..80 is not zero exactly when x
// has a zero byte. The word that holds one is not then stepped through
// byte by byte: the lowest byte the test marks is the first quote or
// backslash (a mark above a true one may be false, from the subtraction's
// borrow; none below).
func plain(b []byte, i int) ([]byte, int, bool) {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	j := i
	for ; j+8 <= len(b); j += 8 {
		w := binary.LittleEndian.Uint64(b[j:])
		q, bs := w^(lo*'"'), w^(lo*'\\')
		if m := ((q-lo)&^q | (bs-lo)&^bs) & hi; m != 0 {
			j += bits.TrailingZeros64(m) >> 3
			if b[j] == '"' {
				return b[i:j], j + 1, true
			}
			return nil, j, false
		}
	}
	for ; j < len(b); j++ {
		switch b[j] {
		case '"':
			return b[i:j], j + 1, true
		case '\\':
			return nil, j, false
		}
	}
	return nil, len(b), false
}
