package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"cairn/internal/app/cmdline"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/group"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
)

// runMember runs j as a member of its group (cairn run on a job with a
// group section). Its HTTP server shows the sub-topologies it runs now
// (the dashboard, /metrics and /api/stats of each Running it starts, 503
// while it runs none) and /api/group, the group as the KV bucket holds it.
func runMember(ctx context.Context, j *job.Job, ro runtime.Options, member string, ln net.Listener, acc dashboard.Access, log *slog.Logger) error {
	var mu sync.Mutex
	var cur http.Handler
	var stopCur func()
	var m *group.Member
	cfg := group.RunConfig{Job: j, Options: ro, Member: member, Log: log,
		Joined: func(jm *group.Member) {
			mu.Lock()
			m = jm
			mu.Unlock()
		},
		Started: func(r *runtime.Running) {
			if ln == nil {
				return
			}
			h, stop := runtime.Handler(acc, r)
			mu.Lock()
			cur, stopCur = h, stop
			mu.Unlock()
		},
		Stopped: func(*runtime.Running) {
			mu.Lock()
			if stopCur != nil {
				stopCur()
			}
			cur, stopCur = nil, nil
			mu.Unlock()
		},
	}
	if ln != nil {
		mux := http.NewServeMux()
		mux.HandleFunc("/api/group", func(w http.ResponseWriter, req *http.Request) {
			mu.Lock()
			jm := m
			mu.Unlock()
			if jm == nil {
				http.Error(w, "not joined yet", http.StatusServiceUnavailable)
				return
			}
			st, err := jm.Status(req.Context())
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(st)
		})
		// A savepoint of a group's job is group-wide: this member asks
		// each sub-topology's owner for its part (group.Member.Savepoint).
		plan, err := runtime.NewPlan(j)
		if err != nil {
			return err
		}
		mux.Handle("POST /api/action/savepoint", dashboard.ActionHandler(acc.Token, map[string]func(*http.Request) (int, string){
			"savepoint": func(req *http.Request) (int, string) {
				mu.Lock()
				jm := m
				mu.Unlock()
				if jm == nil {
					return http.StatusServiceUnavailable, "not joined yet"
				}
				return jm.Savepoint(req.Context(), plan, req.URL.Query().Get("name"), dashboard.WantsJSON(req))
			},
		}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
			mu.Lock()
			h := cur
			mu.Unlock()
			if h == nil {
				http.Error(w, "this group member runs no sub-topology now; /api/group shows the group", http.StatusServiceUnavailable)
				return
			}
			h.ServeHTTP(w, req)
		})
		srv := &http.Server{Handler: dashboard.Protect(mux, acc), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		log.Info("http listening", "addr", ln.Addr().String())
	}
	return group.Run(ctx, cfg)
}

// cmdGroup is `cairn group status`.
func cmdGroup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) < 1 || args[0] != "status" {
		fmt.Fprintln(stderr, "usage: cairn group status --job FILE [--json]")
		return fmt.Errorf("cairn group: want status")
	}
	fs := cmdline.NewFlagSet("group status", "cairn group status --job FILE [--nats URL] [--json]", stderr)
	jobFile := fs.String("job", "", "job file (YAML) of the group's job")
	nats := fs.String("nats", "", "NATS URL (overrides nats:)")
	asJSON := fs.Bool("json", false, "print the status as JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	j, err := loadJob(fs, *jobFile, Overrides{NATS: *nats})
	if err != nil {
		return err
	}
	if j.NATS == "embedded" {
		return fmt.Errorf("cairn group status: job %s uses the embedded server; a group shares a NATS server or cluster: give its URL with --nats", j.Name)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := group.StatusOf(sctx, j, cmdline.NewLogger(stderr, "warn"))
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	plan, err := runtime.NewPlan(j)
	if err != nil {
		return err
	}
	printGroupStatus(stdout, st, plan)
	return nil
}

func printGroupStatus(w io.Writer, st group.Status, plan *runtime.Plan) {
	fmt.Fprintf(w, "job %s: %d members, coordinator %s, assignment revision %d, epoch %d\n", st.Job, len(st.Members), orNone(st.Coordinator), st.AssignmentRevision, st.Assignment.Epoch)
	name := func(k int) string {
		if k < len(plan.Subs) {
			return plan.SubName(k)
		}
		return fmt.Sprintf("sub-topology %d (not in the job file: changed since?)", k)
	}
	owns := map[string][]string{}
	for _, o := range st.Assignment.Ranges {
		for k := o.Lo; k < o.Hi; k++ {
			s := name(k)
			if o.Next != "" {
				s += " → " + o.Next
			}
			owns[o.Owner] = append(owns[o.Owner], s)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tLEASE\tSUB-TOPOLOGIES")
	for _, m := range st.Members {
		lease := "live"
		if m.Leaving {
			lease = "leaving"
		}
		subs := owns[m.ID]
		sort.Strings(subs)
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m.ID, lease, orNone(strings.Join(subs, ", ")))
	}
	_ = tw.Flush()
	// What each member reported of what it runs: how far it got, the lag
	// behind its input, its newest checkpoint.
	var rows []string
	for _, m := range st.Members {
		if !m.Reported {
			if len(owns[m.ID]) > 0 {
				rows = append(rows, fmt.Sprintf("-\t%s\t(no answer in time)\t\t", m.ID))
			}
			continue
		}
		for _, r := range m.Running {
			lag := "-"
			if r.StreamLastSeq > 0 || r.ProcessedSeq == 0 {
				lag = strconv.FormatUint(r.Lag, 10)
			}
			chk := "none yet"
			if r.Checkpoint > 0 {
				chk = fmt.Sprintf("%d (source_seq %d)", r.Checkpoint, r.CheckpointSeq)
			}
			rows = append(rows, fmt.Sprintf("%s\t%s\t%d\t%s\t%s", r.Name, m.ID, r.ProcessedSeq, lag, chk))
		}
	}
	if len(rows) > 0 {
		sort.Strings(rows)
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SUB-TOPOLOGY\tMEMBER\tPROCESSED\tLAG\tLAST CHECKPOINT")
		for _, r := range rows {
			fmt.Fprintln(tw, r)
		}
		_ = tw.Flush()
	}
	for _, o := range st.Orphaned {
		for k := o.Lo; k < o.Hi; k++ {
			fmt.Fprintf(w, "orphaned: %s (owner %s has no lease: a takeover is due)\n", name(k), o.Owner)
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
