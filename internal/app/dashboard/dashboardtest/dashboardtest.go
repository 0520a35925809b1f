// Package dashboardtest loads cairn's dashboard in a real browser (headless Chromium) for
// tests, here and in end-to-end tests of a running demo.
package dashboardtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// ErrNoChromium means no Chromium binary was found.
var ErrNoChromium = errors.New("dashboardtest: no chromium found (install it with `apt-get install chromium`, or set CAIRN_CHROMIUM to its path)")

// Chromium returns the path of a Chromium binary: $CAIRN_CHROMIUM if set, else the first
// of chromium, chromium-browser, google-chrome on PATH, else /usr/bin/chromium.
func Chromium() (string, error) {
	if p := os.Getenv("CAIRN_CHROMIUM"); p != "" {
		return exec.LookPath(p)
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", ErrNoChromium
}

// RequireChromium returns the path of Chromium. Without one it skips t, saying how to run
// the test, unless CI is "true": there a missing browser fails t.
func RequireChromium(t testing.TB) string {
	t.Helper()
	p, err := Chromium()
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("browser test under CI=true: %v", err)
	}
	t.Skipf("skipping the browser test: %v; it runs (and must pass) under CI=true", err)
	return ""
}

// DumpDOM loads url in headless Chromium, lets its scripts run for budget of virtual time
// (timers fire as fast as the page allows, network requests are waited for) and returns
// the serialized DOM. Each call uses a fresh profile directory.
func DumpDOM(ctx context.Context, chromium, url string, budget time.Duration) (string, error) {
	profile, err := os.MkdirTemp("", "cairn-chromium-")
	if err != nil {
		return "", fmt.Errorf("dashboardtest: profile dir: %w", err)
	}
	defer os.RemoveAll(profile)
	cmd := exec.CommandContext(ctx, chromium,
		"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--user-data-dir="+profile,
		"--window-size=1280,2000",
		"--virtual-time-budget="+strconv.FormatInt(budget.Milliseconds(), 10),
		"--dump-dom", url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Chromium's helper processes may keep the pipes open after the browser exits.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil && stdout.Len() == 0 {
		return "", fmt.Errorf("dashboardtest: %s --dump-dom %s: %w\n%s", chromium, url, err, tail(stderr.Bytes(), 4000))
	}
	if !bytes.Contains(stdout.Bytes(), []byte("<html")) {
		return "", fmt.Errorf("dashboardtest: %s printed no DOM for %s\n%s", chromium, url, tail(stderr.Bytes(), 4000))
	}
	return stdout.String(), nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Chart is one chart of the dashboard as the browser drew it.
type Chart struct {
	// Name is the svg's data-chart attribute.
	Name string
	// Points is its data-points attribute: the number of data points drawn.
	Points int
	// Series counts the drawn point elements by their data-series attribute.
	Series map[string]int
	// Values holds the data-value attributes of the point elements by series, in order.
	Values map[string][]float64
}

var (
	svgOpen = regexp.MustCompile(`<svg\b[^>]*>`)
	attr    = regexp.MustCompile(`([a-zA-Z_:][-a-zA-Z0-9_:.]*)="([^"]*)"`)
	element = regexp.MustCompile(`<[a-z]+\b[^>]*\bdata-series="[^"]*"[^>]*>`)
)

// Charts returns the charts found in a DOM dump, by name.
func Charts(dom string) map[string]Chart {
	charts := map[string]Chart{}
	for _, loc := range svgOpen.FindAllStringIndex(dom, -1) {
		attrs := attributes(dom[loc[0]:loc[1]])
		name, ok := attrs["data-chart"]
		if !ok {
			continue
		}
		points, _ := strconv.Atoi(attrs["data-points"])
		c := Chart{Name: name, Points: points, Series: map[string]int{}, Values: map[string][]float64{}}
		body := dom[loc[1]:]
		if end := bytes.Index([]byte(body), []byte("</svg>")); end >= 0 {
			body = body[:end]
		}
		for _, e := range element.FindAllString(body, -1) {
			a := attributes(e)
			c.Series[a["data-series"]]++
			v, _ := strconv.ParseFloat(a["data-value"], 64)
			c.Values[a["data-series"]] = append(c.Values[a["data-series"]], v)
		}
		charts[name] = c
	}
	return charts
}

func attributes(tag string) map[string]string {
	m := map[string]string{}
	for _, a := range attr.FindAllStringSubmatch(tag, -1) {
		m[a[1]] = a[2]
	}
	return m
}
