package devloop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"cairn/internal/app/cmdline"
	"cairn/internal/app/runtime"
	"cairn/wasm"
)

// BuildCommand builds an operator project and checks the module against the ABI:
//
//	cairn build [DIR]      run DIR/build.sh (cairn new writes one per language), then check the newest .wasm
//	cairn build FILE.wasm  check a module built elsewhere
//
// The check compiles the module the way a job does (the imports it may
// have, the exports it must have, the size limit) and prints its size,
// language, interface and the sha256 line that pins it in a job file.
func BuildCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("build", "cairn build [DIR|FILE.wasm]", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	target := "."
	if fs.NArg() > 0 {
		target = fs.Arg(0)
	}
	module := target
	lang := "unknown"
	if !strings.HasSuffix(target, ".wasm") {
		lang = projectLanguage(target)
		script := filepath.Join(target, "build.sh")
		if _, err := os.Stat(script); err != nil {
			return fmt.Errorf("%s has no build.sh: cairn build runs the build script of a project written by cairn new operator (or give it a .wasm file to check)", target)
		}
		start := time.Now()
		cmd := exec.CommandContext(ctx, "sh", "build.sh")
		cmd.Dir = target
		cmd.Stdout, cmd.Stderr = stderr, stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s build failed (%s/build.sh): %w", lang, target, err)
		}
		var err error
		if module, err = newestWasm(target, start); err != nil {
			return err
		}
	}
	b, err := runtime.ReadModule(module, runtime.MaxModuleBytes)
	if err != nil {
		return err
	}
	rt, err := wasm.NewRuntime(ctx, wasm.RuntimeConfig{MaxModuleBytes: runtime.MaxModuleBytes})
	if err != nil {
		return err
	}
	defer rt.Close(ctx)
	m, err := rt.Compile(ctx, filepath.Base(module), b)
	if err != nil {
		return fmt.Errorf("%s does not follow the cairn ABI: %w", module, err)
	}
	in, err := m.Interface(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s, %s, speaks %s\n", module, runtime.FormatBytes(uint64(len(b))), lang, fmt.Sprintf("cairn_v%d", m.ABIVersion()))
	fmt.Fprintf(stdout, "  imports: %s\n", strings.Join(orNone(in.Imports), " "))
	fmt.Fprintf(stdout, "  exports: %s\n", strings.Join(in.Exports, " "))
	mem := fmt.Sprintf("%d pages (%s) initially", in.MemoryMin, runtime.FormatBytes(uint64(in.MemoryMin)*64<<10))
	if in.MemoryMax > 0 {
		mem += fmt.Sprintf(", at most %d", in.MemoryMax)
	}
	fmt.Fprintf(stdout, "  memory:  %s; a job limits it per stage (memory:, default 256MiB)\n", mem)
	fmt.Fprintf(stdout, "pin it in the job file's stage: sha256: %s\n", m.Hash())
	return nil
}

func orNone(s []string) []string {
	if len(s) == 0 {
		return []string{"(none)"}
	}
	return s
}

// projectLanguage names a project's language from its files.
func projectLanguage(dir string) string {
	has := func(pattern string) bool {
		m, _ := filepath.Glob(filepath.Join(dir, pattern))
		return len(m) > 0
	}
	switch {
	case has("go.mod"):
		return "Go"
	case has("*.rs") || has("src/*.rs"):
		return "Rust"
	case has("*.c"):
		return "C"
	case has("*.ts") || has("assembly/*.ts"):
		return "AssemblyScript"
	}
	return "unknown language"
}

// newestWasm is the .wasm file in dir written at or after since.
func newestWasm(dir string, since time.Time) (string, error) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.wasm"))
	var best string
	var bestTime time.Time
	for _, f := range files {
		fi, err := os.Stat(f)
		if err == nil && !fi.ModTime().Before(since.Add(-time.Second)) && fi.ModTime().After(bestTime) {
			best, bestTime = f, fi.ModTime()
		}
	}
	if best == "" {
		return "", errors.New("the build wrote no .wasm file in " + dir)
	}
	return best, nil
}
