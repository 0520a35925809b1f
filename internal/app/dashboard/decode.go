package dashboard

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// DecodeSnapshot reads the JSON of GET /api/snapshot back into a Snapshot: a supervisor
// (cairn demo) shows its job process's dashboard data as its own. Times come back at
// millisecond and durations at nanosecond precision.
func DecodeSnapshot(data []byte) (Snapshot, error) {
	var v apiSnapshot
	if err := json.Unmarshal(data, &v); err != nil {
		return Snapshot{}, fmt.Errorf("dashboard: decode snapshot: %w", err)
	}
	s := Snapshot{
		Job: v.Job, Slots: v.Slots, KeyGroups: v.KeyGroups, Delivery: v.Delivery, CheckpointInterval: fromSeconds(v.Interval),
		RecordsIn: v.RecordsIn, RecordsOut: v.RecordsOut, DeadLetters: v.DeadLetters, OutputsSkipped: v.Skipped, RepeatsDropped: v.Repeats, UpstreamMissing: v.Missing,
		ConsumedSeq: v.ConsumedSeq, ProcessedSeq: v.ProcessedSeq, StreamLastSeq: v.StreamLastSeq,
		Watermark: math.MinInt64, StateBytes: v.StateBytes, Drill: v.Drill,
	}
	if v.WatermarkMs != nil {
		s.Watermark = *v.WatermarkMs
	}
	for _, c := range v.Checkpoints {
		s.Checkpoints = append(s.Checkpoints, Checkpoint{
			ID: c.ID, Mode: c.Mode, Time: fromMs(c.TimeMs), Failed: c.Failed, Error: c.Error,
			SyncDuration: fromSeconds(c.Sync), AsyncDuration: fromSeconds(c.Async),
			BytesUploaded: c.BytesUploaded, FullStateSize: c.FullState, FilesUploaded: c.FilesUploaded,
			FilesReused: c.FilesReused, ChainLength: c.ChainLength,
			RetainedExclusive: c.RetainedExclusive, RetainedShared: c.RetainedShared,
			PredictedRestore: fromSeconds(c.PredictedRestore), Prediction: c.Prediction, Reason: c.Reason,
		})
	}
	for _, r := range v.Restores {
		s.Restores = append(s.Restores, Restore{
			CheckpointID: r.CheckpointID, Mode: r.Mode, Time: fromMs(r.TimeMs), Duration: fromSeconds(r.Duration),
			BytesLocal: r.BytesLocal, BytesDownloaded: r.BytesDownloaded, Files: r.Files,
			Rescaled: r.Rescaled, FromSlots: r.FromSlots, ToSlots: r.ToSlots, ChainLength: r.ChainLength, Source: r.Source,
			CheckpointDuration: fromSecondsPtr(r.Checkpoint), PredictedRestore: fromSecondsPtr(r.Predicted), CaughtUp: fromSecondsPtr(r.CaughtUp),
			Online: r.Online, BytesRemote: r.BytesRemote, FullyLocal: fromSecondsPtr(r.FullyLocal), BytesMoved: r.BytesMoved,
		})
	}
	if l := v.Latency; l != nil {
		s.Latency = &Latency{Bounds: l.Bounds, Counts: l.Counts, Sum: fromSeconds(l.Sum), P50: l.P50, P99: l.P99}
	}
	if sb := v.Standby; sb != nil {
		s.Standby = &StandbyLag{sb.CheckpointsBehind, sb.BytesBehind, sb.LastSyncedID}
	}
	if st := v.Story; st != nil {
		s.Story = &Story{Phase: st.Phase, Progress: st.Progress, Lines: st.Lines}
	}
	s.Presenter, s.Series = v.Presenter, v.Series
	for _, st := range v.SubTopologies {
		sub := SubTopology{Name: st.Name, Slots: st.Slots, RecordsIn: st.RecordsIn, RecordsOut: st.RecordsOut,
			DeadLetters: st.DeadLetters, StreamLastSeq: st.Lag, Watermark: math.MinInt64, StateBytes: st.StateBytes,
			GraphCheckpoint: st.GraphCheckpoint, GraphPart: st.GraphPart}
		if st.WatermarkMs != nil {
			sub.Watermark = *st.WatermarkMs
		}
		s.SubTopologies = append(s.SubTopologies, sub)
	}
	for _, st := range v.Stages {
		s.Stages = append(s.Stages, StageStats(st))
	}
	for _, g := range v.StateGrowth {
		s.StateGrowth = append(s.StateGrowth, StateGrowth{Stage: g.Stage, SubTopology: g.SubTopology, Unbounded: g.Unbounded,
			Since: fromMs(g.SinceMs), Message: g.Message, BytesPerSecond: g.BytesPerSecond, RecordsPerSecond: g.RecordsPerSecond,
			Intervals: g.Intervals, StateBytes: g.StateBytes})
	}
	for _, a := range v.Advice {
		s.Advice = append(s.Advice, Advice{Name: a.Name, Recommend: a.Recommend, Text: a.Text,
			IncrementalTook: fromSecondsPtr(a.IncrementalTook), FullTook: fromSecondsPtr(a.FullTook),
			IncrementalUploaded: a.IncrementalUploaded, FullUploaded: a.FullUploaded,
			IncrementalRestore: fromSecondsPtr(a.IncrementalRestore), FullRestore: fromSecondsPtr(a.FullRestore), StateBytes: a.StateBytes})
	}
	return s, nil
}

func fromMs(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

func fromSeconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }

func fromSecondsPtr(s *float64) time.Duration {
	if s == nil {
		return 0
	}
	return fromSeconds(*s)
}
