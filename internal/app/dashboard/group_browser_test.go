package dashboard

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"cairn/internal/app/dashboard/dashboardtest"
)

// groupJSON is /api/group of member b after it took sub-topology
// topwords.s1 over from a (the shape group.Status encodes to).
const groupJSON = `{"job":"topwords","coordinator":"b","members":[{"id":"a","revision":9,"key_groups":1,"reported":false},
{"id":"b","revision":12,"key_groups":1,"reported":true,"running":[{"name":"topwords","processed_seq":4100,"records_in":4100,"checkpoint":21,"checkpoint_seq":4000,"lag":35}]}],
"assignment":{"epoch":4,"ranges":[{"sub":"sub-topologies","lo":0,"hi":1,"owner":"b","epoch":4},{"sub":"sub-topologies","lo":1,"hi":2,"owner":"a","epoch":3}]},
"assignment_revision":31,"member":"b",
"events":[{"at":"2026-12-06T23:00:00Z","gained":["topwords"],"running":["topwords"],"running_after_ns":700000000,
"restores":[{"sub_topology":"topwords","checkpoint":17,"took_ns":48000000,"predicted_ns":61000000,"bytes_downloaded":17266,"bytes_local":0}]},
{"at":"2026-12-06T23:00:09Z","member":"b","gained":["topwords.s1"],"lost":[],"running":["topwords","topwords.s1"],"running_after_ns":910000000,
"restores":[{"sub_topology":"topwords","checkpoint":20,"took_ns":11000000,"bytes_downloaded":0,"bytes_local":19356},{"sub_topology":"topwords.s1","checkpoint":23,"took_ns":65000000,"predicted_ns":80000000,"bytes_downloaded":14545,"bytes_local":0}]}]}`

// TestBrowserGroup: a group member's dashboard shows the group (members,
// what each runs) and this member's changes, the takeover with its
// restores measured beside their predictions; a job outside a group (no
// /api/group) shows no group card.
func TestBrowserGroup(t *testing.T) {
	chromium := dashboardtest.RequireChromium(t)
	for _, member := range []bool{true, false} {
		mux := http.NewServeMux()
		if member {
			mux.HandleFunc("/api/group", func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, groupJSON)
			})
		}
		// The group demo's page offers the kill-member action beside the card.
		o := Options{}
		if member {
			o.Actions = map[string]func(*http.Request) (int, string){"kill-member": func(*http.Request) (int, string) { return http.StatusOK, "killed a" }}
		}
		mux.Handle("/", Handler(newFakeSource(), o))
		ln, err := Listen("127.0.0.1:0", "")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		dom, err := dashboardtest.DumpDOM(ctx, chromium, "http://"+ln.Addr().String()+"/", 3*time.Second)
		cancel()
		_ = srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		hidden := regexp.MustCompile(`id="groupCard"[^>]*|class="[^"]*hidden[^"]*" id="groupCard"`).FindString(dom)
		if !member {
			if !strings.Contains(dom, `class="card wide hidden" id="groupCard"`) {
				t.Errorf("a job outside a group shows the group card: %q", hidden)
			}
			continue
		}
		if strings.Contains(dom, "lost <") || strings.Contains(dom, "; lost") {
			t.Error("the group card names an empty change")
		}
		for _, text := range []string{"2 members, coordinator b", "b (this one)", "gained topwords.s1", "topwords, topwords.s1",
			"topwords.s1 65.0 ms / 80.0 ms (14.2 KiB downloaded)", "topwords 11.0 ms / calibrating", "910 ms",
			"topwords: lag 35, checkpoint #21", "no answer",
			`data-action="kill-member"`, ">kill -9 a member<", `placeholder="member (any)"`} {
			if !strings.Contains(dom, text) {
				t.Errorf("the group card is missing %q", text)
			}
		}
		if strings.Contains(dom, `class="card wide hidden" id="groupCard"`) {
			t.Error("a group member's page hides the group card")
		}
		if t.Failed() {
			writeArtifact(t, "dashboard-group-dom.html", dom)
		}
	}
}
