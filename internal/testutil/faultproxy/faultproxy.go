// Package faultproxy is a TCP proxy on 127.0.0.1 that puts network faults
// between a client and a server in tests: a delay on every chunk, a
// bandwidth cap, a black hole (bytes are taken and dropped, in both
// directions, connections stay open) and resets (every connection closed
// with a TCP RST). The faults apply to the connections open and to new
// ones, until changed.
//
// A pipe's writer holds its chunks through a black hole; Close ends it.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards connections accepted on its address to the target.
type Proxy struct {
	ln     net.Listener
	target string

	delay     atomic.Int64 // nanoseconds added to every chunk
	bandwidth atomic.Int64 // bytes per second per direction (0: no cap)
	blackhole atomic.Bool
	refuse    atomic.Bool // new connections are closed at once

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	// Resets counts the connections reset; Accepted those accepted.
	Resets, Accepted atomic.Int64
}

// Start listens on 127.0.0.1 (a free port) and forwards to target
// ("host:port"); the proxy closes when the test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// New starts a proxy to target; Close stops it.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address (127.0.0.1:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL is a NATS URL of the proxy.
func (p *Proxy) URL() string { return "nats://" + p.Addr() }

// SetDelay delays every chunk of bytes by d in each direction (0: none).
// Order is kept: a chunk never overtakes an earlier one.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// SetBandwidth caps each direction of each connection at bytesPerSecond
// (0: no cap).
func (p *Proxy) SetBandwidth(bytesPerSecond int64) { p.bandwidth.Store(bytesPerSecond) }

// BlackHole, on, delivers nothing in either direction while connections
// stay open, as a network partition does: no FIN, no RST, and new
// connections are accepted and hear nothing. Bytes sent meanwhile are
// held, not dropped (TCP retransmits under a partition; a stream with
// bytes missing from its middle is not a fault a network makes): off, they
// arrive, late, unless an end gave up and closed the connection first.
func (p *Proxy) BlackHole(on bool) { p.blackhole.Store(on) }

// Refuse, on, closes new connections at once (a server that is down);
// open ones are left as they are.
func (p *Proxy) Refuse(on bool) { p.refuse.Store(on) }

// Reset closes every open connection, both sides, with a TCP RST.
func (p *Proxy) Reset() {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		reset(c)
	}
	p.Resets.Add(int64(len(conns)) / 2)
}

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close sends RST
	}
	_ = c.Close()
}

// Close stops accepting, resets every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Reset()
	p.wg.Wait()
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.refuse.Load() {
			reset(client)
			continue
		}
		p.Accepted.Add(1)
		server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			reset(client)
			continue
		}
		if !p.track(client) || !p.track(server) {
			reset(client)
			reset(server)
			return
		}
		p.wg.Add(2)
		go p.pipe(client, server)
		go p.pipe(server, client)
	}
}

// chunk is bytes read, due to be written at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies from src to dst with the faults: a reader queues chunks with
// their due time, a writer writes them in order when due (dropping them in
// a black hole, pacing them under a bandwidth cap). When either side ends,
// both connections close.
func (p *Proxy) pipe(src, dst net.Conn) {
	defer p.wg.Done()
	defer p.untrack(src)
	q := make(chan chunk, 1024)
	var done sync.WaitGroup
	done.Add(1)
	go func() {
		defer done.Done()
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			for p.blackhole.Load() {
				if p.isClosed() {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			if bw := p.bandwidth.Load(); bw > 0 {
				time.Sleep(time.Duration(int64(len(c.b)) * int64(time.Second) / bw))
			}
			if _, err := dst.Write(c.b); err != nil {
				_ = src.Close()
				for range q { // drain so the reader never blocks
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		size := len(buf)
		if bw := p.bandwidth.Load(); bw > 0 {
			size = int(min(max(bw/20, 1), int64(len(buf)))) // small chunks: smooth pacing
		}
		n, err := src.Read(buf[:size])
		if n > 0 {
			b := make([]byte, n)
			copy(b, buf[:n])
			q <- chunk{b: b, due: time.Now().Add(time.Duration(p.delay.Load()))}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				reset(dst)
			}
			break
		}
	}
	close(q)
	done.Wait()
	_ = dst.Close()
}
