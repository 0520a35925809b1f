// Package jobproc runs a job as a separate `cairn run` process and drives it
// through its HTTP port: start it, read its stats, ask for checkpoints, kill it
// with SIGKILL or stop it gracefully. `cairn drill` and `cairn demo` both
// supervise their job this way, so that a kill is a real kill of a real
// process, not a cancelled goroutine.
package jobproc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configure Start.
type Options struct {
	// Binary is the cairn executable; Args the arguments after "run".
	Binary string
	Args   []string
	// Log receives the process's stdout and stderr lines (nil: discarded).
	Log io.Writer
	// OnLine, when set, sees every stderr line (the job's log) as it comes.
	OnLine func(line string)
	// ReadyTimeout bounds the wait for the HTTP port (default 2 minutes: a
	// restore runs before the port opens).
	ReadyTimeout time.Duration
	// WithParent makes the process die with this one (see withParent).
	WithParent bool
}

// Process is a running `cairn run`.
type Process struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser // closed by Stop: the job stops at its end
	base   string         // http://127.0.0.1:PORT
	exited chan struct{}
	// waitErr is cmd.Wait's result, set before exited is closed.
	waitErr error

	logMu sync.Mutex
	// logTail is the last lines of the job's log, for error messages.
	logTail []string
}

// tailLines is how many log lines Tail keeps.
const tailLines = 20

// Start runs `binary run ...args` and waits until the job is ready: its
// GET /healthz answers 200 (the port is served once the restore is done).
// Pass --http 127.0.0.1:0: Start replaces the 0 with a port it found free.
func Start(ctx context.Context, o Options) (*Process, error) {
	args := append([]string(nil), o.Args...)
	var base string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--http" && args[i+1] == "127.0.0.1:0" {
			addr, err := freeAddr()
			if err != nil {
				return nil, fmt.Errorf("jobproc: a port for the job's HTTP: %w", err)
			}
			args[i+1], base = addr, "http://"+addr
		}
	}
	if base == "" {
		return nil, errors.New("jobproc: pass --http 127.0.0.1:0 (Start chooses the port and waits for /healthz)")
	}
	logw := o.Log
	if logw == nil {
		logw = io.Discard
	}
	cmd := exec.Command(o.Binary, append([]string{"run", "--stop-on-stdin-eof"}, args...)...)
	cmd.Stdout = logw
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if o.WithParent {
		withParent(cmd)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("jobproc: start job process %s: %w", o.Binary, err)
	}
	p := &Process{cmd: cmd, stdin: stdin, exited: make(chan struct{}), base: base}
	scanDone := make(chan struct{})
	go func() {
		defer close(scanDone)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logw, line)
			p.logMu.Lock()
			p.logTail = append(p.logTail, line)
			if len(p.logTail) > tailLines {
				p.logTail = p.logTail[len(p.logTail)-tailLines:]
			}
			p.logMu.Unlock()
			if o.OnLine != nil {
				o.OnLine(line)
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() {
		<-scanDone
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	wait := o.ReadyTimeout
	if wait <= 0 {
		wait = 2 * time.Minute
	}
	deadline := time.After(wait)
	for {
		if p.healthy(ctx) {
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("jobproc: job process exited before it was ready: %v\n%s", p.waitErr, p.Tail())
		case <-deadline:
			p.Kill()
			return nil, fmt.Errorf("jobproc: job process not ready (GET /healthz) within %s\n%s", wait, p.Tail())
		case <-ctx.Done():
			p.Kill()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// healthy reports whether GET /healthz answers 200.
func (p *Process) healthy(ctx context.Context) bool {
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(hctx, http.MethodGet, p.base+"/healthz", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// freeAddr is a 127.0.0.1 address whose port was free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Base is the job's HTTP base URL, http://HOST:PORT.
func (p *Process) Base() string { return p.base }

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Tail is the last lines of the job's log, for error messages.
func (p *Process) Tail() string {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	return "job log (last lines):\n  " + strings.Join(p.logTail, "\n  ")
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Stop asks the job to stop gracefully (it takes its final checkpoint) and
// waits for it, killing it when ctx ends first. The ask is SIGTERM and, for
// systems without it (Windows), the end of the job's standard input
// (`cairn run --stop-on-stdin-eof`).
func (p *Process) Stop(ctx context.Context) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.stdin.Close()
	select {
	case <-p.exited:
		return p.waitErr
	case <-ctx.Done():
		p.Kill()
		return fmt.Errorf("jobproc: job process did not stop in time, killed: %w", ctx.Err())
	}
}

// Alive reports an error when the process has exited.
func (p *Process) Alive() error {
	select {
	case <-p.exited:
		return fmt.Errorf("jobproc: job process exited: %v\n%s", p.waitErr, p.Tail())
	default:
		return nil
	}
}

// Stats is the part of the job's /api/stats (engine.Stats) a supervisor reads.
type Stats struct {
	RecordsIn, RecordsOut, DeadLetters uint64
	ConsumedSeq, ProcessedSeq          uint64
	StateBytes                         []uint64
}

// Stats reads the job's /api/stats.
func (p *Process) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	return st, p.getJSON(ctx, "/api/stats", &st)
}

// getJSON reads path (for example /api/snapshot) into v.
func (p *Process) getJSON(ctx context.Context, path string, v any) error {
	body, err := p.Get(ctx, path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("jobproc: %s: %w", path, err)
	}
	return nil
}

// Get reads path from the job's HTTP port.
func (p *Process) Get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if aerr := p.Alive(); aerr != nil {
			return nil, aerr
		}
		return nil, fmt.Errorf("jobproc: %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(body))
	}
	if err != nil {
		return nil, fmt.Errorf("jobproc: %s: %w", path, err)
	}
	return body, nil
}

// ErrBusy is the job's answer while another checkpoint is in flight.
var ErrBusy = errors.New("jobproc: a checkpoint is already in flight")

// Action posts POST /api/action/NAME?query and returns the job's answer;
// HTTP 409 (another checkpoint in flight) is ErrBusy.
func (p *Process) Action(ctx context.Context, name, query string) (string, error) {
	return p.action(ctx, name, query, false)
}

// action posts an action; asJSON asks for the JSON answer.
func (p *Process) action(ctx context.Context, name, query string, asJSON bool) (string, error) {
	u := p.base + "/api/action/" + name
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return "", err
	}
	if asJSON {
		req.Header.Set("Accept", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if aerr := p.Alive(); aerr != nil {
			return "", aerr
		}
		return "", fmt.Errorf("jobproc: %s: %w", name, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	msg := string(bytes.TrimSpace(body))
	switch resp.StatusCode {
	case http.StatusOK:
		return msg, nil
	case http.StatusConflict:
		return msg, fmt.Errorf("%w: %s", ErrBusy, msg)
	}
	return msg, fmt.Errorf("jobproc: %s: %s: %s", name, resp.Status, msg)
}

// Checkpoint is the job's answer to a checkpoint action.
type Checkpoint struct {
	ID        uint64
	SourceSeq uint64
	// Duration is the engine's: barrier to manifest commit.
	Duration time.Duration
	// SubTopologies of a job graph: each one's checkpoint, in order (the
	// fields above are the first's); nil for a job that is one chain.
	SubTopologies []Checkpoint
}

// Checkpoint asks the job for a checkpoint of mode ("full", "incremental",
// or "" for the job's own choice) and waits for its commit, retrying while
// another checkpoint is in flight.
func (p *Process) Checkpoint(ctx context.Context, mode string) (Checkpoint, error) {
	var t Checkpoint
	query := ""
	if mode != "" {
		query = "mode=" + mode
	}
	for attempt := 0; ; attempt++ {
		body, err := p.action(ctx, "checkpoint", query, true)
		if errors.Is(err, ErrBusy) && attempt < 100 {
			select {
			case <-time.After(100 * time.Millisecond):
				continue
			case <-ctx.Done():
				return t, ctx.Err()
			}
		}
		if err != nil {
			return t, fmt.Errorf("%s checkpoint: %w", mode, err)
		}
		return ParseCheckpoint(body)
	}
}

// ParseCheckpoint reads the job's JSON answer to a checkpoint action
// (Action asks for JSON): {"id", "source_seq", "duration_ms"}, and for a
// job graph each sub-topology's under "sub_topologies".
func ParseCheckpoint(answer string) (Checkpoint, error) {
	type taken struct {
		ID            uint64  `json:"id"`
		SourceSeq     uint64  `json:"source_seq"`
		DurationMs    int64   `json:"duration_ms"`
		SubTopologies []taken `json:"sub_topologies"`
	}
	var a taken
	if err := json.Unmarshal([]byte(answer), &a); err != nil || a.ID == 0 {
		return Checkpoint{}, fmt.Errorf("jobproc: unexpected checkpoint answer %q: %v", answer, err)
	}
	conv := func(t taken) Checkpoint {
		return Checkpoint{ID: t.ID, SourceSeq: t.SourceSeq, Duration: time.Duration(t.DurationMs) * time.Millisecond}
	}
	c := conv(a)
	for _, s := range a.SubTopologies {
		if s.ID == 0 {
			return Checkpoint{}, fmt.Errorf("jobproc: unexpected checkpoint answer %q: a sub-topology without an id", answer)
		}
		c.SubTopologies = append(c.SubTopologies, conv(s))
	}
	return c, nil
}
