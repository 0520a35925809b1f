package runtime

import (
	"log/slog"

	"cairn/checkpoint"
	"cairn/recovery"
)

// noteRestoredObjects tells the checkpoint writer what the restore read
// from the store: the first checkpoint after it then reuses those objects
// without reading them back (at scale that read-back is the whole state,
// and after an online restore it would share the link with the download
// the job waits for).
func noteRestoredObjects(w *checkpoint.Writer, res *recovery.Result, log *slog.Logger) {
	if w == nil || res == nil {
		return
	}
	read := w.Restored(res.Read)
	online := w.OnlineRestore(res.RemoteObjects)
	if read+online > 0 {
		log.Debug("checkpoint writer: restored objects need no read-back", "downloaded", read, "online", online)
	}
}
