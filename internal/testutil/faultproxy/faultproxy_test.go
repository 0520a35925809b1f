package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// echo is a TCP echo server on 127.0.0.1.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func roundTrip(t *testing.T, c net.Conn, msg []byte) []byte {
	t.Helper()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestForwardDelayBandwidth(t *testing.T) {
	p := Start(t, echo(t))
	c := dial(t, p)
	msg := bytes.Repeat([]byte("cairn"), 1000)
	if got := roundTrip(t, c, msg); !bytes.Equal(got, msg) {
		t.Fatal("echo through the proxy differs")
	}
	// A delay applies in each direction: a round trip takes at least 2d.
	p.SetDelay(100 * time.Millisecond)
	t0 := time.Now()
	if got := roundTrip(t, c, []byte("x")); string(got) != "x" {
		t.Fatalf("got %q", got)
	}
	if took := time.Since(t0); took < 200*time.Millisecond {
		t.Errorf("round trip with 100ms delay each way took %s", took)
	}
	p.SetDelay(0)
	// 20 kB at 40 kB/s each way: at least 0.5 s (a lower bound only).
	p.SetBandwidth(40_000)
	big := bytes.Repeat([]byte{7}, 20_000)
	t0 = time.Now()
	if got := roundTrip(t, c, big); !bytes.Equal(got, big) {
		t.Fatal("bytes lost under the bandwidth cap")
	}
	if took := time.Since(t0); took < 500*time.Millisecond {
		t.Errorf("20kB at 40kB/s took %s", took)
	}
}

func TestBlackHoleAndReset(t *testing.T) {
	p := Start(t, echo(t))
	c := dial(t, p)
	roundTrip(t, c, []byte("a"))
	p.BlackHole(true)
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var b [8]byte
	if n, err := c.Read(b[:]); !errors.Is(err, osErrDeadline()) {
		t.Fatalf("read %q, %v in a black hole: want nothing (a timeout)", b[:n], err)
	}
	p.BlackHole(false)
	_ = c.SetReadDeadline(time.Time{})
	// What the black hole held arrives, then new bytes.
	if got := roundTrip(t, c, []byte("back")); string(got) != "held" {
		t.Fatalf("after the black hole: %q, want the held bytes first", got)
	}
	var rest [4]byte
	if _, err := io.ReadFull(c, rest[:]); err != nil || string(rest[:]) != "back" {
		t.Fatalf("then %q, %v", rest, err)
	}
	p.Reset()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(b[:])
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("read after a reset: %v, want a reset", err)
	}
	if p.Resets.Load() != 1 {
		t.Errorf("Resets = %d, want 1", p.Resets.Load())
	}
	// Refuse: new connections close at once.
	p.Refuse(true)
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		return // reset before the dial returned
	}
	defer c2.Close()
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c2.Read(b[:]); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a refused connection: %v, want it closed", err)
	}
}

func osErrDeadline() error { return os.ErrDeadlineExceeded }
