package dashboardtest

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"
)

// Browser is a headless Chromium page driven over the DevTools protocol on a pipe
// (--remote-debugging-pipe: requests on the browser's fd 3, answers on its fd 4, each a
// JSON message ended by a NUL byte): a test clicks buttons and reads the page as a person
// would see it, with no driver library and no network port.
type Browser struct {
	cmd     *exec.Cmd
	profile string
	toB     *os.File // our end of the browser's fd 3
	fromB   *os.File // our end of the browser's fd 4
	session string

	mu      sync.Mutex
	nextID  int
	pending map[int]chan cdpAnswer
	readErr error
	done    chan struct{}
}

type cdpAnswer struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// Open starts headless Chromium and opens url in a page of width×height pixels.
func Open(ctx context.Context, chromium, url string, width, height int) (*Browser, error) {
	profile, err := os.MkdirTemp("", "cairn-chromium-")
	if err != nil {
		return nil, fmt.Errorf("dashboardtest: profile dir: %w", err)
	}
	inR, inW, err := os.Pipe() // we write, the browser reads (its fd 3)
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe() // the browser writes (its fd 4), we read
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(chromium,
		"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars", "--user-data-dir="+profile,
		fmt.Sprintf("--window-size=%d,%d", width, height),
		"--remote-debugging-pipe", "about:blank")
	cmd.ExtraFiles = []*os.File{inR, outW}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(profile)
		return nil, fmt.Errorf("dashboardtest: start %s: %w", chromium, err)
	}
	inR.Close()
	outW.Close()
	b := &Browser{cmd: cmd, profile: profile, toB: inW, fromB: outR, pending: map[int]chan cdpAnswer{}, done: make(chan struct{})}
	go b.read()
	target, err := b.call(ctx, "", "Target.createTarget", map[string]any{"url": url})
	if err != nil {
		b.Close()
		return nil, err
	}
	var t struct {
		TargetID string `json:"targetId"`
	}
	_ = json.Unmarshal(target, &t)
	att, err := b.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": t.TargetID, "flatten": true})
	if err != nil {
		b.Close()
		return nil, err
	}
	var a struct {
		SessionID string `json:"sessionId"`
	}
	_ = json.Unmarshal(att, &a)
	b.session = a.SessionID
	return b, nil
}

// read dispatches the browser's answers to their callers; events are dropped.
func (b *Browser) read() {
	defer close(b.done)
	r := bufio.NewReaderSize(b.fromB, 1<<20)
	for {
		msg, err := r.ReadBytes(0)
		if err != nil {
			b.mu.Lock()
			b.readErr = err
			for id, ch := range b.pending {
				close(ch)
				delete(b.pending, id)
			}
			b.mu.Unlock()
			return
		}
		var m struct {
			ID int `json:"id"`
			cdpAnswer
		}
		if json.Unmarshal(msg[:len(msg)-1], &m) != nil || m.ID == 0 {
			continue
		}
		b.mu.Lock()
		ch := b.pending[m.ID]
		delete(b.pending, m.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- m.cdpAnswer
		}
	}
}

// call sends one DevTools command (to the page's session unless session is "") and
// waits for its answer.
func (b *Browser) call(ctx context.Context, session, method string, params any) (json.RawMessage, error) {
	b.mu.Lock()
	if b.readErr != nil {
		b.mu.Unlock()
		return nil, fmt.Errorf("dashboardtest: browser gone: %w", b.readErr)
	}
	b.nextID++
	id := b.nextID
	ch := make(chan cdpAnswer, 1)
	b.pending[id] = ch
	b.mu.Unlock()
	req := map[string]any{"id": id, "method": method, "params": params}
	if session != "" {
		req["sessionId"] = session
	}
	msg, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, err := b.toB.Write(append(msg, 0)); err != nil {
		return nil, fmt.Errorf("dashboardtest: %s: %w", method, err)
	}
	select {
	case a, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("dashboardtest: %s: the browser exited", method)
		}
		if a.Error != nil {
			return nil, fmt.Errorf("dashboardtest: %s: %s", method, a.Error.Message)
		}
		return a.Result, nil
	case <-ctx.Done():
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
		return nil, fmt.Errorf("dashboardtest: %s: %w", method, ctx.Err())
	}
}

// Eval evaluates a JavaScript expression in the page (awaiting a promise) and decodes
// its JSON-serialisable value into v (nil: dropped).
func (b *Browser) Eval(ctx context.Context, expr string, v any) error {
	res, err := b.call(ctx, b.session, "Runtime.evaluate", map[string]any{
		"expression": expr, "returnByValue": true, "awaitPromise": true,
	})
	if err != nil {
		return err
	}
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return err
	}
	if r.Exception != nil {
		return fmt.Errorf("dashboardtest: %s: %s %s", expr, r.Exception.Text, r.Exception.Exception.Description)
	}
	if v == nil || len(r.Result.Value) == 0 {
		return nil
	}
	return json.Unmarshal(r.Result.Value, v)
}

// WaitFor evaluates expr until it is true, every 100 ms until ctx ends.
func (b *Browser) WaitFor(ctx context.Context, expr string) error {
	for {
		var ok bool
		err := b.Eval(ctx, "!!("+expr+")", &ok)
		if err == nil && ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = errors.New("still false")
			}
			return fmt.Errorf("dashboardtest: waiting for %s: %v (%w)", expr, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// DOM returns the page's serialized DOM, as DumpDOM does.
func (b *Browser) DOM(ctx context.Context) (string, error) {
	var s string
	err := b.Eval(ctx, "document.documentElement.outerHTML", &s)
	return s, err
}

// Screenshot writes the whole page as a PNG file.
func (b *Browser) Screenshot(ctx context.Context, path string) error {
	res, err := b.call(ctx, b.session, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true})
	if err != nil {
		return err
	}
	var r struct {
		Data string `json:"data"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return err
	}
	png, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil {
		return err
	}
	return os.WriteFile(path, png, 0o644)
}

// Close ends the browser and removes its profile.
func (b *Browser) Close() {
	_ = b.toB.Close() // the browser exits when its pipe closes
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
	}
	_ = b.cmd.Process.Kill()
	_ = b.cmd.Wait()
	_ = b.fromB.Close()
	os.RemoveAll(b.profile)
}
