package wasm

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"cairn/operators/builtin"
)

// memRuntime returns a Runtime whose guest memory is allocated the mode way.
func memRuntime(t testing.TB, mode memoryMode) *Runtime {
	t.Helper()
	ctx := context.Background()
	r, err := NewRuntime(ctx, RuntimeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r.mem = mode
	t.Cleanup(func() { r.Close(ctx) })
	return r
}

// growBy calls the grow module's grow(pages): the previous size in pages,
// or -1 when memory.grow failed.
func growBy(t testing.TB, i *Instance, pages uint32) int32 {
	t.Helper()
	res, err := i.mod.ExportedFunction("grow").Call(context.Background(), uint64(pages))
	if err != nil {
		t.Fatal(err)
	}
	return int32(res[0])
}

// growToLimit grows i by step pages until memory.grow fails, calling
// sample after each step; it returns the size reached, in pages.
func growToLimit(t testing.TB, i *Instance, step uint32, sample func()) uint32 {
	t.Helper()
	for s := step; ; {
		if growBy(t, i, s) >= 0 {
			sample()
			continue
		}
		if s == 1 {
			return i.mem.Size() >> 16
		}
		s = 1 // the last steps, up to the limit exactly
	}
}

// TestGuestMemoryRSS grows every instance (2 slots at a 64 MiB limit) to its
// limit, writing every page, and checks what the host process pays: at most
// the limit per instance plus 64 MiB, and the memory back at each Close.
// (With wazero's default Go-heap memory, memHeap, the growth alone peaks at
// about 4× the limit and nothing is returned before a GC.)
func TestGuestMemoryRSS(t *testing.T) {
	if _, ok := rssNoGC(); !ok || !mmapSupported {
		t.Skip("needs /proc/self/statm and mmap-backed guest memory")
	}
	const (
		instances = 2
		pages     = 1024 // 64 MiB
		limit     = int64(pages) << 16
		overhead  = int64(64 << 20)
	)
	ctx := context.Background()
	r := memRuntime(t, defaultMemoryMode())
	m, err := r.Compile(ctx, "grow", growModule(0))
	if err != nil {
		t.Fatal(err)
	}
	var insts []*Instance
	for k := 0; k < instances; k++ {
		i, err := m.Instantiate(ctx, InstanceConfig{Stage: "grow", Slot: k, MemoryPages: pages})
		if err != nil {
			t.Fatal(err)
		}
		defer i.Close(ctx)
		insts = append(insts, i)
	}
	base, _ := rss()
	peak := base
	sample := func() {
		if v, _ := rssNoGC(); v > peak {
			peak = v
		}
	}
	for _, i := range insts {
		if got := growToLimit(t, i, 16, sample); got != pages {
			t.Fatalf("grew to %d pages, the limit is %d", got, pages)
		}
	}
	grown, _ := rss()
	t.Logf("RSS: base %d MiB, peak %d MiB (+%d), at the limit %d MiB (+%d); %d × %d MiB",
		base>>20, peak>>20, (peak-base)>>20, grown>>20, (grown-base)>>20, instances, limit>>20)
	if d := peak - base; d > instances*limit+overhead {
		t.Errorf("RSS grew by %d MiB for %d instances at %d MiB: over limit × instances + %d MiB",
			d>>20, instances, limit>>20, overhead>>20)
	}
	if d := grown - base; d < instances*limit*9/10 {
		t.Errorf("RSS grew by only %d MiB: the guests did not write their memory?", d>>20)
	}
	// The instances run normally at their limit.
	for _, i := range insts {
		if _, err := i.Process(ctx, &Batch{Records: []Record{rec(1, "k", "v", 1)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Each Close returns its memory to the OS at once (no GC).
	for k, i := range insts {
		before, _ := rssNoGC()
		if err := i.Close(ctx); err != nil {
			t.Fatal(err)
		}
		after, _ := rssNoGC()
		t.Logf("close %d: RSS %d → %d MiB", k, before>>20, after>>20)
		if d := before - after; d < limit*3/4 {
			t.Errorf("close %d returned %d MiB, want about %d", k, d>>20, limit>>20)
		}
	}
}

// TestGuestMemoryLimit: memory grows up to the instance's limit (or the
// module's declared maximum when smaller) and no further, keeping its
// contents; in each allocation mode.
func TestGuestMemoryLimit(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []memoryMode{memMmap, memHeap} {
		r := memRuntime(t, mode)
		for _, tc := range []struct {
			declared, limit, want uint32
		}{{0, 40, 40}, {24, 40, 24}, {64, 40, 40}} {
			t.Run(fmt.Sprintf("%v/declared=%d/limit=%d", mode, tc.declared, tc.limit), func(t *testing.T) {
				m, err := r.Compile(ctx, "grow", growModule(tc.declared))
				if err != nil {
					t.Fatal(err)
				}
				i, err := m.Instantiate(ctx, InstanceConfig{MemoryPages: tc.limit})
				if err != nil {
					t.Fatal(err)
				}
				defer i.Close(ctx)
				start := i.mem.Size() >> 16
				if got := growToLimit(t, i, 3, func() {}); got != tc.want {
					t.Fatalf("grew to %d pages, want %d", got, tc.want)
				}
				if growBy(t, i, 1) != -1 || i.mem.Size()>>16 != tc.want {
					t.Fatal("grew past the limit")
				}
				// Every page written by grow kept its byte across the
				// later grows; the data segment is intact.
				for off := start << 16; off < tc.want<<16; off += 4096 {
					if v, ok := i.mem.ReadByte(off); !ok || v != 1 {
						t.Fatalf("byte at %d = %d, %v after growth", off, v, ok)
					}
				}
				if v, _ := i.mem.ReadByte(16); v != 1 {
					t.Fatalf("data segment lost: %d", v)
				}
				if _, err := i.Process(ctx, &Batch{Records: []Record{rec(1, "k", "v", 1)}}, nil); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestRuntimeCloseDuringCall: Runtime.Close while a call runs (it closes the
// instance's module) must not unmap the memory under the call, which reads
// it in a loop: the call fails, the host reads the guest's progress word,
// the instance then refuses calls, and the memory is released.
func TestRuntimeCloseDuringCall(t *testing.T) {
	ctx := context.Background()
	r, err := NewRuntime(ctx, RuntimeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	m, err := r.Compile(ctx, "grow", growModule(0))
	if err != nil {
		t.Fatal(err)
	}
	// A deadline compiles in the checks that stop a closed module's loop.
	i, err := m.Instantiate(ctx, InstanceConfig{Stage: "spin", Deadline: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !i.mem.WriteUint32Le(8, 1) { // cairn_process spins
		t.Fatal("write")
	}
	done := make(chan error)
	go func() {
		_, err := i.Process(ctx, &Batch{Records: []Record{rec(3, "a", "v", 1)}}, nil)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var te *TrapError
	select {
	case err := <-done:
		if !errors.As(err, &te) || te.Seq != 3 {
			t.Fatalf("want a TrapError at seq 3, got %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not stop after Runtime.Close")
	}
	if _, err := i.Process(ctx, &Batch{Records: []Record{rec(4, "a", "v", 1)}}, nil); !errors.Is(err, ErrInstanceUnusable) {
		t.Fatalf("after Runtime.Close: %v", err)
	}
	if g := i.guard; g != nil {
		g.mu.Lock()
		defer g.mu.Unlock()
		if !g.freed || g.busy != 0 || len(g.pending) != 0 {
			t.Fatalf("memory not released after the call: freed %v busy %d pending %d", g.freed, g.busy, len(g.pending))
		}
	}
	_ = i.Close(ctx)
}

// BenchmarkGuestMemoryGrow grows one or two instances to a 256 MiB limit in
// 4 MiB steps (a Go guest's heap arenas), writing every page, then runs a
// batch in each, for each way of allocating guest memory. ns/op is the
// growth; the metrics are RSS deltas from the process's RSS (after a GC)
// before instantiation:
//
//	peak-MiB    the highest RSS sampled during the growth
//	churn-MiB   the highest RSS while the host then allocates and drops
//	            512 MiB (the GC's heap goal counts Go-heap guest memory)
//	closed-MiB  RSS right after closing the instances, without a GC
func BenchmarkGuestMemoryGrow(b *testing.B) {
	if _, ok := rssNoGC(); !ok {
		b.Skip("needs /proc/self/statm")
	}
	const pages = 4096
	modes := []memoryMode{memHeap, memCapFromMax}
	if mmapSupported {
		modes = append(modes, memMmap)
	}
	for _, mode := range modes {
		for _, n := range []int{1, 2} {
			b.Run(fmt.Sprintf("mode=%v/instances=%d", mode, n), func(b *testing.B) {
				ctx := context.Background()
				r := memRuntime(b, mode)
				m, err := r.Compile(ctx, "grow", growModule(0))
				if err != nil {
					b.Fatal(err)
				}
				var peak, churn, closed int64
				for b.Loop() {
					b.StopTimer()
					base, _ := rss()
					sample := func(p *int64) {
						if v, _ := rssNoGC(); v-base > *p {
							*p = v - base
						}
					}
					insts := make([]*Instance, n)
					for k := range insts {
						if insts[k], err = m.Instantiate(ctx, InstanceConfig{Slot: k, MemoryPages: pages}); err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
					for _, i := range insts {
						if got := growToLimit(b, i, 64, func() { sample(&peak) }); got != pages {
							b.Fatalf("grew to %d pages", got)
						}
					}
					b.StopTimer()
					for _, i := range insts {
						if _, err := i.Process(ctx, &Batch{Records: []Record{rec(1, "k", "v", 1)}}, nil); err != nil {
							b.Fatal(err)
						}
					}
					for k := 0; k < 512; k++ {
						buf := make([]byte, 1<<20)
						for j := 0; j < len(buf); j += 4096 {
							buf[j] = 1
						}
						benchSink = buf
						if k%8 == 0 {
							sample(&churn)
						}
					}
					benchSink = nil
					for _, i := range insts {
						_ = i.Close(ctx)
					}
					sample(&closed)
					b.StartTimer()
				}
				b.ReportMetric(float64(peak>>20), "peak-MiB")
				b.ReportMetric(float64(churn>>20), "churn-MiB")
				b.ReportMetric(float64(closed>>20), "closed-MiB")
			})
		}
	}
}

var benchSink []byte

// BenchmarkCountBatchMemory is BenchmarkCountBatch's count operator (batches
// of 256 records) with guest memory in an mmap per instance and in wazero's
// default Go-heap buffer, in the same run: the allocation must not cost
// throughput.
//
//	go test ./wasm -run '^$' -bench CountBatchMemory -count 4
func BenchmarkCountBatchMemory(b *testing.B) {
	for _, mode := range []memoryMode{memMmap, memHeap} {
		b.Run("mode="+mode.String(), func(b *testing.B) {
			ctx := context.Background()
			m, err := memRuntime(b, mode).Compile(ctx, "count", mustBuiltin(b, "count"))
			if err != nil {
				b.Fatal(err)
			}
			i, err := m.Instantiate(ctx, InstanceConfig{Stage: "count"})
			if err != nil {
				b.Fatal(err)
			}
			st := newMemState()
			batches := zipfBatches(256, 16)
			b.ResetTimer()
			for k := 0; k < b.N; k++ {
				out, err := i.Process(ctx, batches[k%len(batches)], st)
				if err != nil {
					b.Fatal(err)
				}
				st.apply(out.State)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*256), "ns/record")
		})
	}
}

func mustBuiltin(b testing.TB, name string) []byte {
	b.Helper()
	w, ok := builtin.Lookup(name)
	if !ok {
		b.Fatalf("no builtin %q", name)
	}
	return w
}
