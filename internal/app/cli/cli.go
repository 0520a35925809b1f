// Package cli is cairn's command line: flags, wiring of the parts, the HTTP
// server and the demo.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"cairn/internal/app/cmdline"
	"cairn/internal/app/demo"
	"cairn/internal/app/devloop"
	"cairn/internal/base/procs"
)

// Version is the cairn version, set at build time with -ldflags "-X cairn/internal/cli.Version=...".
var Version = "0.1.0-dev"

type command struct {
	name  string
	usage string
	run   func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"run", "run a job: cairn run --job job.yaml [--nats URL] [--slots N] [--data DIR] [--http ADDR] [--store URL]", cmdRun},
		{"demo", "run the embedded wordcount demo: cairn demo [--duration D] [--rate N]", demo.Command},
		{"checkpoints", "inspect a checkpoint store: cairn checkpoints ls|show|verify|gc --store URL --job NAME", cmdCheckpoints},
		{"savepoint", "take a savepoint of a running job: cairn savepoint --http ADDR --name NAME", cmdSavepoint},
		{"drill", "measure checkpoint duration and restore time: cairn drill [flags]", cmdDrill},
		{"group", "show the members of a job shared by several processes: cairn group status --job FILE", cmdGroup},
		{"standby", "keep a warm copy of a job's checkpoints: cairn standby --job FILE", cmdStandby},
		{"new", "write a new operator project that builds offline: cairn new operator NAME [--lang go]", devloop.NewCommand},
		{"build", "build an operator project and check its module against the ABI: cairn build [DIR|FILE.wasm]", devloop.BuildCommand},
		{"state", "read, export, import, migrate and diff state: cairn state get KEY|scan [PREFIX]|export|import|migrate|diff --job-file FILE", cmdState},
		{"test", "run a job's operators over a file of records, no broker: cairn test --job FILE --input RECORDS.jsonl [--expect FILE] [--restore-every N]", devloop.TestCommand},
		{"nexmark", "the Nexmark benchmark: cairn nexmark gen --events N --rate R --nats URL | cairn nexmark bench [--events N]", cmdNexmark},
		{"version", "print the version", cmdVersion},
	}
}

// Main runs the command line and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		fmt.Fprintf(stdout, "cairn %s\n", Version)
		return 0
	}
	if len(args) < 1 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) < 1 {
			return 2
		}
		return 0
	}
	procs.Tune()
	for _, c := range commands() {
		if c.name == args[0] {
			err := c.run(ctx, args[1:], stdout, stderr)
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			if err != nil {
				fmt.Fprintf(stderr, "cairn %s: %v\n", c.name, err)
				return 1
			}
			return 0
		}
	}
	fmt.Fprintf(stderr, "cairn: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "cairn: a single-binary stateful stream processor (NATS JetStream -> WASM operators -> Pebble state)")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.usage)
	}
	fmt.Fprintln(w, "\nRun 'cairn COMMAND --help' for the flags of a command.")
}

func cmdVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("version", "cairn version", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "cairn %s (operator ABI cairn_v1, cairn_v2)\n", Version)
	return nil
}
