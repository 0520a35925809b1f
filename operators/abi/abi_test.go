package abi

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

func randBytes(r *rand.Rand, max int) []byte {
	b := make([]byte, r.IntN(max+1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func randInput(r *rand.Rand) *Input {
	in := &Input{Version: Version, Watermark: int64(r.Uint64()), ProcTime: int64(r.Uint64())}
	if r.IntN(2) == 0 {
		in.Version = Version2
	}
	for range r.IntN(5) + 1 {
		k := Key{Key: randBytes(r, 8), Fetch: Fetch(r.IntN(3))}
		if k.Fetch == Present {
			k.Value = randBytes(r, 16)
		}
		in.Keys = append(in.Keys, k)
	}
	for range r.IntN(4) {
		in.Timers = append(in.Timers, Timer{KeyIdx: uint32(r.IntN(len(in.Keys))), Time: int64(r.Uint64()), Processing: r.IntN(2) == 0})
	}
	for range r.IntN(6) {
		rec := Record{KeyIdx: uint32(r.IntN(len(in.Keys))), Time: int64(r.Uint64()), Value: randBytes(r, 16)}
		if in.Version == Version2 {
			rec.Side = uint8(r.IntN(2))
			rec.Delete = r.IntN(4) == 0
		}
		in.Records = append(in.Records, rec)
	}
	return in
}

func randOutput(r *rand.Rand) *Output {
	o := &Output{}
	for range r.IntN(4) {
		o.Emits = append(o.Emits, Emit{Port: uint8(r.IntN(3)), Source: int32(r.Uint32()), Time: int64(r.Uint64()), Key: randBytes(r, 8), Value: randBytes(r, 8)})
	}
	for range r.IntN(4) {
		s := StateOp{KeyIdx: r.Uint32(), Sub: randBytes(r, 4), Delete: r.IntN(2) == 0}
		if !s.Delete {
			s.Value = randBytes(r, 8)
		}
		o.State = append(o.State, s)
	}
	for range r.IntN(4) {
		o.Timers = append(o.Timers, TimerOp{KeyIdx: r.Uint32(), Time: int64(r.Uint64()), Processing: r.IntN(2) == 0, Delete: r.IntN(2) == 0})
	}
	for range r.IntN(3) {
		o.Logs = append(o.Logs, Log{Level: int32(r.Uint32()), Msg: randBytes(r, 10)})
	}
	if r.IntN(3) == 0 {
		o.Failed, o.ErrSource, o.ErrMsg = true, int32(r.Uint32()), randBytes(r, 10)
	}
	return o
}

// norm maps empty byte slices to nil so decoded and original compare equal.
func norm(v any) any {
	rv := reflect.ValueOf(v).Elem()
	var walk func(reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Slice:
			if v.Type().Elem().Kind() == reflect.Uint8 {
				if v.Len() == 0 && v.CanSet() {
					v.Set(reflect.Zero(v.Type()))
				}
				return
			}
			if v.Len() == 0 && v.CanSet() {
				v.Set(reflect.Zero(v.Type()))
			}
			for i := 0; i < v.Len(); i++ {
				walk(v.Index(i))
			}
		case reflect.Struct:
			for i := 0; i < v.NumField(); i++ {
				walk(v.Field(i))
			}
		}
	}
	walk(rv)
	return v
}

func TestInputRoundTrip(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 1))
	var got Input
	for range 500 {
		in := randInput(r)
		if err := DecodeInput(AppendInput(nil, in), &got); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if !reflect.DeepEqual(norm(in), norm(&got)) {
			t.Fatalf("seed %d: round trip\n in %+v\nout %+v", seed, in, got)
		}
	}
}

func TestOutputRoundTrip(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 2))
	var got Output
	for range 500 {
		o := randOutput(r)
		if err := DecodeOutput(AppendOutput(nil, o), &got); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if !reflect.DeepEqual(norm(o), norm(&got)) {
			t.Fatalf("seed %d: round trip\n in %+v\nout %+v", seed, o, got)
		}
	}
}

func TestScanRoundTrip(t *testing.T) {
	var b []byte
	b = AppendScanEntry(b, []byte("a"), []byte("1"))
	b = AppendScanEntry(b, nil, []byte("22"))
	var got []string
	if err := DecodeScan(b, func(s, v []byte) { got = append(got, string(s)+"="+string(v)) }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []string{"a=1", "=22"}) {
		t.Fatal(got)
	}
	if err := DecodeScan(b[:len(b)-1], func(s, v []byte) {}); !errors.Is(err, ErrMalformed) {
		t.Fatal(err)
	}
}

func TestDecodeRejects(t *testing.T) {
	var in Input
	var out Output
	good := AppendInput(nil, &Input{Keys: []Key{{Key: []byte("k")}}, Records: []Record{{Value: []byte("v")}}})
	for n := 0; n < len(good); n++ {
		if err := DecodeInput(good[:n], &in); !errors.Is(err, ErrMalformed) {
			t.Fatalf("truncated input at %d: %v", n, err)
		}
	}
	bad := bytes.Clone(good)
	bad[0] = 2
	if err := DecodeInput(bad, &in); !errors.Is(err, ErrMalformed) {
		t.Fatal("wrong version accepted")
	}
	if err := DecodeInput(append(bytes.Clone(good), 0), &in); !errors.Is(err, ErrMalformed) {
		t.Fatal("trailing bytes accepted")
	}
	badIdx := AppendInput(nil, &Input{Keys: []Key{{Key: []byte("k")}}, Records: []Record{{KeyIdx: 1}}})
	if err := DecodeInput(badIdx, &in); !errors.Is(err, ErrMalformed) {
		t.Fatal("key index out of range accepted")
	}
	for _, b := range [][]byte{
		nil,
		{Version, 99},
		{Version, TagError, 0, 0, 0, 0, 0, 0, 0, 0, TagError, 0, 0, 0, 0, 0, 0, 0, 0},
		{Version, TagEmit, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0xff, 0xff, 0xff, 0xff},
		{Version, TagState, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 'x'},
	} {
		if err := DecodeOutput(b, &out); !errors.Is(err, ErrMalformed) {
			t.Fatalf("%x accepted: %v", b, err)
		}
	}
	// A huge count fails before allocating.
	huge := append(AppendInputHeader(nil, 0, math.MinInt64), 0xff, 0xff, 0xff, 0xff)
	if err := DecodeInput(huge, &in); !errors.Is(err, ErrMalformed) {
		t.Fatal(err)
	}
}

func FuzzDecodeInput(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 1))
	for range 8 {
		f.Add(AppendInput(nil, randInput(r)))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var in Input
		if err := DecodeInput(b, &in); err != nil {
			return
		}
		if again := AppendInput(nil, &in); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", b, again)
		}
	})
}
