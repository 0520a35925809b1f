// Package cmdline holds what every command of cairn's command line shares:
// its flag sets and their help, its logger, and whether it prints to a
// terminal. The commands themselves live with what they run (cli, demo,
// devloop).
package cmdline

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// NewFlagSet is a command's flag set: errors return (no exit), and its
// help prints the usage line and the flags as cairn spells them.
func NewFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("cairn "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s\n\nFlags:\n", usage)
		PrintFlags(stderr, fs)
	}
	return fs
}

// PrintFlags lists a command's flags spelled as the usage lines spell them
// (--name; Go's flag package takes -name too, but prints only that).
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			line += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	})
}

// NewLogger is a text logger at level (debug, info, warn or error).
func NewLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// ParseInterspersed parses flags that may come before or after positional
// arguments, and returns the positional ones.
func ParseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	nul, err := os.Stat(os.DevNull) // a character device too, but no terminal
	return err != nil || !os.SameFile(fi, nul)
}
