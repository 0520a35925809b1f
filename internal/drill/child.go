package drill

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"
)

// child is the job process: `cairn run` started from the drill's binary,
// driven through its HTTP port and killed with SIGKILL.
type child struct {
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:PORT
	exited chan struct{}
	// waitErr is cmd.Wait's result, set before exited is closed.
	waitErr error

	logMu sync.Mutex
	// logTail is the last lines of the job's log, for error messages.
	logTail []string
}

var httpAddrRE = regexp.MustCompile(`msg="http listening" addr=(\S+)`)

// startChild runs `binary run ...args` with its log going to logPath, and
// waits until its HTTP port answers.
func startChild(ctx context.Context, binary string, args []string, logPath string) (*child, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, append([]string{"run"}, args...)...)
	cmd.Stdout = logf
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("drill: start job process %s: %w", binary, err)
	}
	c := &child{cmd: cmd, exited: make(chan struct{})}
	addr := make(chan string, 1)
	scanDone := make(chan struct{})
	go func() {
		defer close(scanDone)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			c.logMu.Lock()
			c.logTail = append(c.logTail, line)
			if len(c.logTail) > 20 {
				c.logTail = c.logTail[len(c.logTail)-20:]
			}
			c.logMu.Unlock()
			if m := httpAddrRE.FindStringSubmatch(line); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
	}()
	go func() {
		<-scanDone
		c.waitErr = cmd.Wait()
		logf.Close()
		close(c.exited)
	}()
	select {
	case a := <-addr:
		c.base = "http://" + a
	case <-c.exited:
		return nil, fmt.Errorf("drill: job process exited before serving HTTP: %v\n%s", c.waitErr, c.tail())
	case <-time.After(2 * time.Minute):
		c.kill()
		return nil, fmt.Errorf("drill: job process did not serve HTTP within 2 minutes\n%s", c.tail())
	case <-ctx.Done():
		c.kill()
		return nil, ctx.Err()
	}
	return c, nil
}

func (c *child) tail() string {
	c.logMu.Lock()
	defer c.logMu.Unlock()
	return "job log (last lines):\n  " + strings.Join(c.logTail, "\n  ")
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// alive reports an error when the process has exited.
func (c *child) alive() error {
	select {
	case <-c.exited:
		return fmt.Errorf("drill: job process exited: %v\n%s", c.waitErr, c.tail())
	default:
		return nil
	}
}

// stats is the part of the job's /api/stats the drill reads.
type stats struct {
	ProcessedSeq uint64
	RecordsIn    uint64
	StateBytes   []uint64
}

func (c *child) stats(ctx context.Context) (stats, error) {
	var st stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/api/stats", nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if aerr := c.alive(); aerr != nil {
			return st, aerr
		}
		return st, fmt.Errorf("drill: job stats: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("drill: job stats: %w", err)
	}
	return st, nil
}

// waitProcessed waits until the job has processed every input message up
// to seq, reporting progress in messages from done0.
func (c *child) waitProcessed(ctx context.Context, seq, done0 uint64, prog *phaseProgress) error {
	for {
		st, err := c.stats(ctx)
		if err != nil {
			return err
		}
		prog.set(int64(st.ProcessedSeq) - int64(done0))
		if st.ProcessedSeq >= seq {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkpointTaken is the job's answer to a checkpoint action.
type checkpointTaken struct {
	ID        uint64
	SourceSeq uint64
	// Duration is the engine's: barrier to manifest commit.
	Duration time.Duration
}

// checkpoint asks the job for a checkpoint of mode and waits for its commit.
func (c *child) checkpoint(ctx context.Context, mode string) (checkpointTaken, error) {
	var t checkpointTaken
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/api/action/checkpoint?mode="+mode, nil)
		if err != nil {
			return t, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			if aerr := c.alive(); aerr != nil {
				return t, aerr
			}
			return t, fmt.Errorf("drill: %s checkpoint: %w", mode, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = bytes.TrimSpace(body)
		if resp.StatusCode == http.StatusConflict && attempt < 100 {
			time.Sleep(100 * time.Millisecond) // another checkpoint in flight
			continue
		}
		if resp.StatusCode != http.StatusOK {
			return t, fmt.Errorf("drill: %s checkpoint: %s: %s", mode, resp.Status, body)
		}
		var d string
		if _, err := fmt.Sscanf(string(body), "checkpoint %d committed at source_seq %d in %s", &t.ID, &t.SourceSeq, &d); err != nil {
			return t, fmt.Errorf("drill: %s checkpoint: unexpected answer %q: %w", mode, body, err)
		}
		if t.Duration, err = time.ParseDuration(d); err != nil {
			return t, fmt.Errorf("drill: %s checkpoint: unexpected answer %q: %w", mode, body, err)
		}
		return t, nil
	}
}

var errNoBinary = errors.New("drill: Config.Binary (the cairn executable that runs the job) is required")
