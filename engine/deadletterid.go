package engine

import (
	"crypto/sha256"
	"encoding/base64"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// DeadLetterDuplicateWindow is the duplicate window of a dead-letter stream
// cairn creates: a replay within it publishes no dead letter twice.
const DeadLetterDuplicateWindow = time.Hour

// deadLetterID is a dead letter's Nats-Msg-Id: the same for every replay
// of its record, so the dead-letter stream's duplicate window drops the
// copies a replay after a restore publishes again. It hashes what names
// the dead letter and does not change between replays: the job (each
// sub-topology is one), the stage, the input sequence, the record's
// headers and payload. The reason is left out (an error may carry a
// duration or an address), and so are the headers a replay may set
// otherwise: the watermark an output carried and the producer's
// expectations.
func deadLetterID(job, stage string, seq uint64, h nats.Header, data []byte) string {
	d := sha256.New()
	w := func(s string) {
		d.Write([]byte(strconv.Itoa(len(s))))
		d.Write([]byte{':'})
		d.Write([]byte(s))
	}
	w(stage)
	w(strconv.FormatUint(seq, 10))
	keys := make([]string, 0, len(h))
	for k := range h {
		if k == HeaderWatermark || strings.HasPrefix(k, "Nats-Expected-") {
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		w(k)
		for _, v := range h[k] {
			w(v)
		}
	}
	d.Write(data)
	return "cairn-dl/" + job + "/" + base64.RawURLEncoding.EncodeToString(d.Sum(nil)[:18])
}
