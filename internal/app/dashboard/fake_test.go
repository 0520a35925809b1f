package dashboard

import (
	"encoding/json"
	"sync"
	"time"
)

const mib = 1 << 20

// fakeSource is a Source holding real-looking data: 30 checkpoint attempts (full ones at
// ids 1, 11 and 21, compactions at 6, 16 and 26, a failure at 14), three restores (one
// rescaled), a standby and a drill result. Its counters advance on every Snapshot, like
// a running job's.
type fakeSource struct {
	mu   sync.Mutex
	snap Snapshot
}

var _ Source = (*fakeSource)(nil)

func newFakeSource() *fakeSource {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const bandwidth = 50 * mib // bytes per second, the measured store bandwidth
	var cks []Checkpoint
	chain, full := 0, int64(160*mib)
	for id := uint64(1); id <= 30; id++ {
		t := base.Add(time.Duration(id) * 10 * time.Second)
		if id == 14 {
			cks = append(cks, Checkpoint{ID: id, Mode: "incremental", Time: t, Failed: true,
				Error:        "upload slot 2: put s3://AKIAEXAMPLE:hunter2@bucket/cp/000014/slot-2/000123.sst: connection reset",
				SyncDuration: 12 * time.Millisecond})
			continue
		}
		full += int64(id%7) * mib
		c := Checkpoint{ID: id, Time: t, Mode: "incremental", FullStateSize: full,
			SyncDuration: time.Duration(5+id%9*4) * time.Millisecond}
		switch {
		case id%10 == 1:
			c.Mode, chain = "full", 1
			c.BytesUploaded, c.FilesUploaded, c.FilesReused = full, 48, 0
		case id%10 == 6:
			chain++
			c.BytesUploaded, c.FilesUploaded, c.FilesReused = int64(60+id%4*8)*mib, 21, 30
		default:
			chain++
			c.BytesUploaded, c.FilesUploaded, c.FilesReused = int64(2+id%6*2)*mib, 3+int(id%4), 45
		}
		c.ChainLength = chain
		c.AsyncDuration = 50*time.Millisecond + time.Duration(float64(c.BytesUploaded)/bandwidth*float64(time.Second))
		c.RetainedShared = full * 8 / 10
		c.RetainedExclusive = int64(chain)*6*mib + c.BytesUploaded/2
		c.PredictedRestore = 400*time.Millisecond + time.Duration(float64(full)/bandwidth*float64(time.Second))
		cks = append(cks, c)
	}
	drill, _ := json.Marshal(map[string]any{
		"state_bytes": 180 * mib, "change": 0.01, "slots": 4, "rescale_to": 2, "bandwidth_bytes": bandwidth,
		"scenarios": []map[string]any{
			{"name": "store after incremental", "checkpoint_p50_seconds": 0.21, "checkpoint_max_seconds": 1.6, "restore_seconds": 4.9, "predicted_restore_seconds": 4.6, "bytes_downloaded": 212 * mib, "files": 61, "chain_length": 10},
			{"name": "store after full", "checkpoint_p50_seconds": 3.8, "checkpoint_max_seconds": 3.9, "restore_seconds": 4.1, "predicted_restore_seconds": 4.2, "bytes_downloaded": 180 * mib, "files": 48, "chain_length": 1},
			{"name": "local", "checkpoint_p50_seconds": 0.21, "checkpoint_max_seconds": 1.6, "restore_seconds": 0.42, "predicted_restore_seconds": 0.4, "bytes_downloaded": 0, "files": 61, "chain_length": 10},
		},
	})
	return &fakeSource{snap: Snapshot{
		Job: "clicks-per-user", Slots: 4, KeyGroups: 128, Delivery: "transactional", CheckpointInterval: 10 * time.Second,
		RecordsIn: 1_250_000, RecordsOut: 1_249_000, DeadLetters: 17, OutputsSkipped: 1200,
		ConsumedSeq: 1_250_400, ProcessedSeq: 1_250_000, StreamLastSeq: 1_262_000,
		Watermark:  base.Add(5 * time.Minute).UnixMilli(),
		StateBytes: []uint64{48 * mib, 51 * mib, 47 * mib, 50 * mib},
		// 10 records: 6 at most 0.5 ms, 3 at most 2.5 ms, 1 over 60 s.
		Latency:     &Latency{Bounds: []float64{0.0001, 0.0005, 0.0025, 60}, Counts: []uint64{0, 6, 3, 0, 1}, Sum: 61 * time.Second, P50: 0.0005, P99: 60},
		Checkpoints: cks,
		Restores: []Restore{
			{CheckpointID: 21, Mode: "full", Time: base.Add(4 * time.Minute), Duration: 4100 * time.Millisecond,
				BytesDownloaded: cks[20].FullStateSize, Files: 48, FromSlots: 4, ToSlots: 4, ChainLength: 1, Source: "store"},
			{CheckpointID: 29, Mode: "incremental", Time: base.Add(5 * time.Minute), Duration: 420 * time.Millisecond,
				BytesLocal: cks[28].FullStateSize, Files: 61, FromSlots: 4, ToSlots: 4, ChainLength: 9, Source: "local"},
			{CheckpointID: 29, Mode: "incremental", Time: base.Add(6 * time.Minute), Duration: 6300 * time.Millisecond,
				BytesDownloaded: cks[28].FullStateSize, Files: 61, Rescaled: true, FromSlots: 4, ToSlots: 2, ChainLength: 9, Source: "store"},
		},
		Standby: &StandbyLag{CheckpointsBehind: 1, BytesBehind: 6 * mib, LastSyncedID: 29},
		Drill:   drill,
	}}
}

// Snapshot advances the counters as a job processing about 12k records per call would.
func (f *fakeSource) Snapshot() Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snap.RecordsIn += 12_000
	f.snap.RecordsOut += 11_800
	f.snap.ProcessedSeq += 12_000
	f.snap.ConsumedSeq += 12_000
	f.snap.StreamLastSeq += 12_000 + f.snap.RecordsIn%3000
	s := f.snap
	s.Stages = []StageStats{
		{SubTopology: s.Job, Stage: "split", RecordsIn: s.RecordsIn, RecordsOut: 3 * s.RecordsIn},
		{SubTopology: s.Job, Stage: "count", Keyed: true, RecordsIn: 3 * s.RecordsIn, RecordsOut: s.RecordsOut},
	}
	s.Checkpoints = append([]Checkpoint(nil), f.snap.Checkpoints...)
	s.Restores = append([]Restore(nil), f.snap.Restores...)
	return s
}

func (f *fakeSource) addCheckpoint(c Checkpoint) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snap.Checkpoints = append(f.snap.Checkpoints, c)
}

// counts returns the newest completed checkpoint and the numbers of completed and
// failed ones.
func (f *fakeSource) counts() (last Checkpoint, completed, failed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.snap.Checkpoints {
		if c.Failed {
			failed++
		} else {
			completed++
			last = c
		}
	}
	return last, completed, failed
}

const minWatermark = -1 << 63
