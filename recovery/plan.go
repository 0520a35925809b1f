package recovery

import "cairn/checkpoint"

// Plan is what a restore of a manifest will read, told before it runs: the
// bytes it finds on local disk (the node's local checkpoint copy, a standby
// cache) and the bytes it must download from the store.
type Plan struct {
	ID          uint64
	Mode        checkpoint.Mode
	ChainLength int
	FromSlots   int
	ToSlots     int
	Rescaled    bool
	// BytesLocal is found on local disk; BytesDownload comes from the store.
	BytesLocal, BytesDownload int64
	Files                     int
}

// PlanRestore tells what Restore(m, o) would read, by the same rules as the
// restore itself (a local file counts when its trust index or its content
// matches the manifest), without writing anything. A full checkpoint reads
// only the key groups' segments it needs; the plan counts every segment,
// which is what a restore onto any slot count reads in total.
func PlanRestore(m *checkpoint.Manifest, o Options) (Plan, error) {
	if err := check(m, &o); err != nil {
		return Plan{}, err
	}
	p := Plan{
		ID: m.ID, Mode: m.Mode, ChainLength: m.ChainLength, FromSlots: m.SlotCount(), ToSlots: o.Slots,
		Rescaled: o.Slots != m.SlotCount(), Files: len(m.Objects),
	}
	f := newFetcher(m, &o, &counters{})
	for _, obj := range m.Objects {
		_, local := f.candidate(obj, fromLocal)
		if !local {
			_, local = f.candidate(obj, fromCache)
		}
		if local {
			p.BytesLocal += obj.Size
		} else {
			p.BytesDownload += obj.Size
		}
	}
	return p, nil
}
