package dashboard

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// page is the whole dashboard: HTML, CSS and one inline script, no external asset.
//
//go:embed page.html
var page []byte

// pageCSP allows exactly the page's own inline script (by hash), its inline styles and
// requests to its own origin.
var pageCSP = func() string {
	_, rest, ok := bytes.Cut(page, []byte("<script>"))
	script, _, ok2 := bytes.Cut(rest, []byte("</script>"))
	if !ok || !ok2 {
		panic("dashboard: page.html has no <script>")
	}
	sum := sha256.Sum256(script)
	return "default-src 'none'; script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; " +
		"style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

func servePage(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", pageCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	_, _ = w.Write(page)
}

// dataSlot is where RenderStatic puts the snapshot; the page renders it once instead of
// polling when it is not empty.
const dataSlot = `<script type="application/json" id="cairn-data"></script>`

// RenderStatic returns the dashboard page with s embedded: a single file that shows the
// checkpoint, restore and drill charts of one moment without a server (live throughput
// and lag need polling and stay empty). Usable for a report such as drill.html.
func RenderStatic(s Snapshot, now time.Time) ([]byte, error) {
	// json.Marshal escapes <, > and &, so the document cannot close the script element.
	b, err := json.Marshal(newAPISnapshot(s, now))
	if err != nil {
		return nil, fmt.Errorf("dashboard: render static page: %w", err)
	}
	i := bytes.Index(page, []byte(dataSlot))
	if i < 0 {
		return nil, errors.New("dashboard: render static page: page.html has no data slot")
	}
	out := make([]byte, 0, len(page)+len(b))
	out = append(out, page[:i]...)
	out = append(out, dataSlot[:len(dataSlot)-len("</script>")]...)
	out = append(out, b...)
	out = append(out, "</script>"...)
	out = append(out, page[i+len(dataSlot):]...)
	return out, nil
}
