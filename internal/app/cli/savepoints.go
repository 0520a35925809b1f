package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"cairn/checkpoint"
	"cairn/internal/app/cmdline"
	"cairn/internal/app/runtime"
)

const savepointUsage = `cairn savepoint --http ADDR --name NAME [--http-token-file FILE] [--http-ca FILE]   take one from a running job
       cairn savepoint ls [--json] (--store URL --job NAME | --job-file FILE)                 list a job's savepoints
       cairn savepoint rm NAME... (--store URL --job NAME | --job-file FILE)                  remove savepoints`

// cmdSavepoint takes a savepoint of a running job (through its HTTP
// control endpoint), or lists or removes a job's savepoints in its store.
func cmdSavepoint(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "ls", "rm":
			return savepointStore(ctx, args[0], args[1:], stdout, stderr)
		case "take":
			args = args[1:]
		}
	}
	return savepointTake(ctx, args, stdout, stderr)
}

func savepointTake(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("savepoint", savepointUsage, stderr)
	addr := fs.String("http", "127.0.0.1:8080", "the running job's HTTP address (https://HOST:PORT when it serves TLS)")
	name := fs.String("name", "", "savepoint name (letters, digits, '-', '_', '.')")
	tokenFile := fs.String("http-token-file", "", "file holding the job's HTTP token (or set "+EnvHTTPToken+")")
	token := fs.String("http-token", "", "the job's HTTP token on the command line (visible in ps; prefer --http-token-file)")
	caFile := fs.String("http-ca", "", "CA certificate (PEM) that signed the job's HTTPS certificate (default: the system's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := checkpoint.ValidateSavepointName(*name); err != nil {
		fs.Usage()
		return err
	}
	tok, err := httpToken(*token, *tokenFile, slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		return err
	}
	client := http.DefaultClient
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			return fmt.Errorf("--http-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--http-ca %s: no PEM certificate in it", *caFile)
		}
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	}
	base := *addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
		if *caFile != "" {
			base = "https://" + *addr
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/action/savepoint?name="+url.QueryEscape(*name), nil)
	if err != nil {
		return err
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("savepoint %s: %s: %s", *name, resp.Status, strings.TrimSpace(string(body)))
	}
	fmt.Fprintf(stdout, "savepoint %s: %s", *name, body)
	return nil
}

// savepointStore is `cairn savepoint ls|rm`: they work on the store, with
// or without the job running.
func savepointStore(ctx context.Context, sub string, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("savepoint "+sub, savepointUsage, stderr)
	sf := addStoreFlags(fs)
	asJSON := fs.Bool("json", false, "ls: JSON output")
	pos, err := cmdline.ParseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if _, err := sf.resolve(fs); err != nil {
		return err
	}
	storeFlag, jobName := sf.store, sf.job
	if sub == "rm" && len(pos) == 0 {
		fs.Usage()
		return errors.New("rm: name the savepoints to remove (cairn savepoint ls lists them)")
	}
	store, err := checkpoint.OpenStore(ctx, *storeFlag)
	if err != nil {
		return err
	}
	defer store.Close(ctx)
	// A job graph's sub-topologies each keep their part of a savepoint.
	chains, err := graphChains(ctx, store, *jobName)
	if err != nil {
		return err
	}
	if sub == "ls" {
		var list []checkpoint.SavepointInfo
		for k, name := range chains {
			l, err := checkpoint.ListSavepointInfo(ctx, store, name)
			if err != nil {
				return err
			}
			if k == 0 {
				list = l
			}
			if len(chains) > 1 && !*asJSON {
				fmt.Fprintf(stdout, "SUB-TOPOLOGY %d: %s\n", k, name)
				if err := printSavepoints(stdout, l); err != nil {
					return err
				}
			}
		}
		if len(chains) > 1 && !*asJSON {
			return nil
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(list)
		}
		return printSavepoints(stdout, list)
	}
	var missing []string
	for _, name := range pos {
		found := false
		for _, chain := range chains {
			n, b, err := checkpoint.DeleteSavepoint(ctx, store, chain, name)
			if errors.Is(err, checkpoint.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			found = true
			who := ""
			if len(chains) > 1 {
				who = " of " + chain
			}
			fmt.Fprintf(stdout, "removed savepoint %s%s (%d objects, %s)\n", name, who, n, runtime.FormatBytes(uint64(b)))
		}
		if !found {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("no savepoint %s of job %s in the store (cairn savepoint ls lists them): %w", strings.Join(missing, ", "), *jobName, checkpoint.ErrNotFound)
	}
	return nil
}

// printSavepoints prints a table of savepoints.
func printSavepoints(stdout io.Writer, list []checkpoint.SavepointInfo) error {
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tTIME\tSOURCE_SEQ\tSLOTS\tSIZE")
	for _, sp := range list {
		if sp.Corrupt != "" {
			fmt.Fprintf(tw, "%s\tCORRUPT\t-\t-\t-\t-\n", sp.Name)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\n", sp.Name, sp.ID, sp.Time.Local().Format(time.DateTime), sp.SourceSeq, sp.Slots, runtime.FormatBytes(uint64(sp.Bytes)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, sp := range list {
		if sp.Corrupt != "" {
			fmt.Fprintf(stdout, "savepoint %s is CORRUPT and cannot be restored: %s\n", sp.Name, sp.Corrupt)
		}
	}
	return nil
}
