package state

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestRemoteRemaining checks Remaining's bytes, derived from the count of
// missing chunks, against the chunks themselves as reads fill them in any
// order, the short last chunk included.
func TestRemoteRemaining(t *testing.T) {
	const size = 3*RemoteChunk + RemoteChunk/2
	s, r := oneRemote(t, size, nil)
	want := func() int64 {
		var n int64
		for c, ok := range r.have {
			if !ok {
				n += min(int64(c+1)*RemoteChunk, size) - int64(c)*RemoteChunk
			}
		}
		return n
	}
	check := func(step string) {
		t.Helper()
		if _, got := s.Remaining(); got != want() {
			t.Fatalf("%s: Remaining says %d bytes, the chunks %d", step, got, want())
		}
	}
	check("nothing fetched")
	for _, c := range []int64{3, 1, 0, 2} { // the short last chunk first
		if err := r.fill(context.Background(), c*RemoteChunk, 1, nil); err != nil {
			t.Fatal(err)
		}
		check("after a read of chunk " + string(rune('0'+c)))
	}
	if files, b := s.Remaining(); b != 0 || files != 1 {
		t.Fatalf("all fetched, not verified: Remaining = %d files, %d bytes; want 1, 0", files, b)
	}
}

// TestRemoteConcurrentReadsFetchOnce: reads of the same chunk at the same
// time fetch it once (the others wait for that fetch); when the fetch
// fails, its read reports the error and a waiting read fetches the chunk
// itself.
func TestRemoteConcurrentReadsFetchOnce(t *testing.T) {
	for _, failFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "ok", true: "first-fetch-fails"}[failFirst], func(t *testing.T) {
			const size, readers = 2 * RemoteChunk, 8
			content := bytes.Repeat([]byte{9}, size)
			var (
				mu      sync.Mutex
				fetches int
			)
			release := make(chan struct{})
			_, r := oneRemote(t, size, func(_ context.Context, off, n int64) (io.ReadCloser, error) {
				mu.Lock()
				fetches++
				first := fetches == 1
				mu.Unlock()
				if first {
					<-release // every reader is waiting or fetching
					if failFirst {
						return nil, errors.New("store unavailable")
					}
				}
				return io.NopCloser(bytes.NewReader(content[off : off+n])), nil
			})
			errs := make(chan error, readers)
			for range readers {
				go func() { errs <- r.fill(context.Background(), RemoteChunk+100, 10, nil) }()
			}
			// Wait until one read claimed the chunk and the rest wait on it.
			for {
				r.mu.Lock()
				claimed := len(r.inflight) > 0
				r.mu.Unlock()
				if claimed {
					break
				}
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond)
			close(release)
			failed := 0
			for range readers {
				if err := <-errs; err != nil {
					failed++
				}
			}
			want, wantFailed := 1, 0
			if failFirst {
				want, wantFailed = 2, 1
			}
			if fetches != want || failed != wantFailed {
				t.Fatalf("%d concurrent reads of one chunk: %d fetches, %d failed; want %d and %d", readers, fetches, failed, want, wantFailed)
			}
			if !r.have[1] || r.have[0] || len(r.inflight) != 0 {
				t.Fatalf("after the reads: have %v, %d chunks still claimed", r.have, len(r.inflight))
			}
		})
	}
}

// TestPrefetchPays: in auto mode a prefetch pays once a lone miss has been
// measured at PrefetchMinFetch or more, except one call in
// prefetchResample, which reads alone to measure again; never when nothing
// is remote; on and off override the measure.
func TestPrefetchPays(t *testing.T) {
	defer loneFetchNs.Store(loneFetchNs.Load())
	defer SetPrefetch(PrefetchMode(prefetchMode.Load()))
	loneFetchNs.Store(0)
	SetPrefetch(PrefetchAuto)
	d := &DB{}
	count := func(calls int) (yes int) {
		for range calls {
			if d.PrefetchPays() {
				yes++
			}
		}
		return yes
	}
	observeLoneFetch(5 * time.Millisecond)
	if n := count(32); n != 0 {
		t.Fatalf("nothing remote: %d of 32 calls prefetch", n)
	}
	outstanding.Add(1)
	defer outstanding.Add(-1)
	loneFetchNs.Store(0)
	if n := count(32); n != 0 {
		t.Fatalf("no miss measured: %d of 32 calls prefetch", n)
	}
	for range 40 {
		observeLoneFetch(100 * time.Microsecond) // a local file store
	}
	if n := count(32); n != 0 {
		t.Fatalf("misses of %v: %d of 32 calls prefetch", MissCost(), n)
	}
	for range 40 {
		observeLoneFetch(800 * time.Microsecond) // a 50 MB/s link
	}
	if n := count(32); n != 32-32/prefetchResample {
		t.Fatalf("misses of %v: %d of 32 calls prefetch, want all but %d", MissCost(), n, 32/prefetchResample)
	}
	SetPrefetch(PrefetchOff)
	if n := count(32); n != 0 {
		t.Fatalf("off: %d of 32 calls prefetch", n)
	}
	SetPrefetch(PrefetchOn)
	loneFetchNs.Store(0)
	if n := count(32); n != 32 {
		t.Fatalf("on: %d of 32 calls prefetch", n)
	}
}

// TestMissCostOnlyFromReads: the cost of a miss is measured from the
// fetches a DB read makes (one or two chunks), not from a long run such as
// EnsureLocal completing a file, which is a transfer.
func TestMissCostOnlyFromReads(t *testing.T) {
	defer loneFetchNs.Store(loneFetchNs.Load())
	loneFetchNs.Store(0)
	const size = 20 * RemoteChunk
	content := bytes.Repeat([]byte{3}, size)
	_, r := oneRemote(t, size, func(_ context.Context, off, n int64) (io.ReadCloser, error) {
		time.Sleep(time.Millisecond)
		return io.NopCloser(bytes.NewReader(content[off : off+n])), nil
	})
	if err := r.fill(context.Background(), 0, 10*RemoteChunk, nil); err != nil {
		t.Fatal(err)
	}
	if MissCost() != 0 {
		t.Fatalf("a 10-chunk run measured a miss of %v", MissCost())
	}
	if err := r.fill(context.Background(), 15*RemoteChunk+100, 10, nil); err != nil {
		t.Fatal(err)
	}
	if c := MissCost(); c < time.Millisecond {
		t.Fatalf("a one-chunk read measured a miss of %v, its fetch took at least 1ms", c)
	}
}

// oneRemote is a remote set with one object of size bytes, served by fetch
// (nil: bytes of value 7), at a new path; closed when the test ends.
func oneRemote(t *testing.T, size int64, fetch func(ctx context.Context, off, n int64) (io.ReadCloser, error)) (*RemoteSet, *remoteFile) {
	t.Helper()
	if fetch == nil {
		content := bytes.Repeat([]byte{7}, int(size))
		fetch = func(_ context.Context, off, n int64) (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(content[off : off+n])), nil
		}
	}
	path := filepath.Join(t.TempDir(), "000001.sst") // removed after the set closes
	s := NewRemoteSet()
	t.Cleanup(func() { s.Close() })
	if err := s.Add(path, RemoteObject{Name: "obj", Size: size, Fetch: fetch}); err != nil {
		t.Fatal(err)
	}
	return s, s.files[0]
}

// TestSweepWaitsForRemoteFiles: while an online restore's files are remote
// the TTL sweep deletes (and reads) nothing; reads hide the expired entries
// meanwhile, and the sweep deletes them once no file is remote.
func TestSweepWaitsForRemoteFiles(t *testing.T) {
	clock := newFakeClock()
	o := testOptions()
	o.Now = clock.Now
	o.TTL = map[uint8]time.Duration{1: time.Minute}
	d := openDB(t, t.TempDir(), o)
	b := d.NewBatch()
	for i := range 50 {
		b.Put(1, i%testKGs, []byte(fmt.Sprint("k", i)), nil, []byte("v"))
	}
	commit(t, b)
	clock.Advance(2 * time.Minute)

	s, _ := oneRemote(t, 2*RemoteChunk, nil)
	if n, err := d.SweepExpired(100); err != nil || n != 0 {
		t.Fatalf("sweep while a file is remote: removed %d, err %v; want 0", n, err)
	}
	if _, ok := mustGet(t, d, 1, 0, "k0", ""); ok {
		t.Fatal("an expired value is visible while the sweep waits")
	}
	s.Close()
	total := 0
	for range 10 {
		n, err := d.SweepExpired(100)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if total != 50 {
		t.Fatalf("swept %d entries once no file was remote, want 50", total)
	}
}

// TestDownloadSmallestFirst: the background download fetches the set's
// files smallest first, whatever order they were added in.
func TestDownloadSmallestFirst(t *testing.T) {
	var mu sync.Mutex
	var order []int64
	s := NewRemoteSet()
	t.Cleanup(func() { s.Close() })
	dir := t.TempDir()
	for i, size := range []int64{5 * RemoteChunk, RemoteChunk, 3 * RemoteChunk} {
		content := bytes.Repeat([]byte{byte(i)}, int(size))
		sum := sha256.Sum256(content)
		fetch := func(_ context.Context, off, n int64) (io.ReadCloser, error) {
			mu.Lock()
			if len(order) == 0 || order[len(order)-1] != size {
				order = append(order, size)
			}
			mu.Unlock()
			return io.NopCloser(bytes.NewReader(content[off : off+n])), nil
		}
		if err := s.Add(filepath.Join(dir, fmt.Sprintf("%06d.sst", i+1)), RemoteObject{Name: fmt.Sprint("obj", i), Size: size, SHA256: hex.EncodeToString(sum[:]), Fetch: fetch}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Download(context.Background(), 0, 1); err != nil {
		t.Fatal(err)
	}
	if want := []int64{RemoteChunk, 3 * RemoteChunk, 5 * RemoteChunk}; !slices.Equal(order, want) {
		t.Fatalf("downloaded sizes in order %v, want %v", order, want)
	}
}

// TestNextTimerWhileRemote: while an online restore's files are remote,
// NextTimerFrom walks the key groups in parts at once and finds what the
// walk in one finds.
func TestNextTimerWhileRemote(t *testing.T) {
	o := testOptions()
	o.Range = KeyGroupRange{First: 0, Last: testKGs - 1}
	d := openDB(t, t.TempDir(), o)
	b := d.NewBatch()
	for kg := 0; kg < testKGs; kg += 3 {
		b.SetTimer(1, kg, DomainEventTime, int64(1000-kg), []byte("t"))
		b.Put(1, kg, []byte("value"), nil, []byte("v"))
	}
	b.SetTimer(1, testKGs-1, DomainProcessingTime, 7, []byte("p"))
	commit(t, b)
	type answer struct {
		ts int64
		ok bool
	}
	ask := func() []answer {
		var out []answer
		for _, q := range []struct {
			domain uint8
			from   int64
		}{{DomainEventTime, 0}, {DomainEventTime, 1000 - 3*(testKGs/3) + 1}, {DomainEventTime, 2000}, {DomainProcessingTime, 0}, {DomainProcessingTime, 8}} {
			ts, ok, err := d.NextTimerFrom(1, q.domain, q.from)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, answer{ts, ok})
		}
		return out
	}
	local := ask()
	s, _ := oneRemote(t, RemoteChunk, nil)
	if !remoteOutstanding() {
		t.Fatal("no remote file outstanding")
	}
	remote := ask()
	s.Close()
	if fmt.Sprint(local) != fmt.Sprint(remote) || !local[0].ok || local[2].ok || !local[3].ok || local[4].ok {
		t.Fatalf("NextTimerFrom: %v in one walk, %v in parts", local, remote)
	}
}
