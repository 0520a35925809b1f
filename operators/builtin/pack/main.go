// Command pack compresses the example operators built by build.sh: every
// NAME.wasm in a folder becomes NAME.wasm.zst and the .wasm is removed. The
// cairn binary embeds the .zst files: uncompressed, the seven modules (each
// with its own Go runtime) were 19 MiB of a 52.6 MiB binary.
//
// Every module is a Go program with the same runtime and SDK, so they are
// compressed against one of them: BaseName is compressed alone, every other
// module with BaseName's bytes as a raw zstd dictionary (DictID), which
// leaves little more than what differs (one more builtin: ~0.1-0.2 MB
// instead of ~0.85 MB). zstd, best compression, one encoder thread, so the
// bytes are the same on every run.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/zstd"
)

// BaseName and DictID must match operators/builtin's.
const (
	BaseName = "window_count"
	DictID   = 1
	// window must hold the dictionary (a module is ~2-3 MiB) and the
	// module being compressed.
	window = 8 << 20
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pack DIR")
		os.Exit(2)
	}
	if err := pack(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "pack:", err)
		os.Exit(1)
	}
}

func pack(dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.wasm"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no .wasm files in %s", dir)
	}
	base, err := os.ReadFile(filepath.Join(dir, BaseName+".wasm"))
	if err != nil {
		return fmt.Errorf("the base module: %w", err)
	}
	opts := []zstd.EOption{zstd.WithEncoderLevel(zstd.SpeedBestCompression), zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(window)}
	plain, err := zstd.NewWriter(nil, opts...)
	if err != nil {
		return err
	}
	withBase, err := zstd.NewWriter(nil, append(opts, zstd.WithEncoderDictRaw(DictID, base))...)
	if err != nil {
		return err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		enc := withBase
		if filepath.Base(f) == BaseName+".wasm" {
			enc = plain
		}
		if err := os.WriteFile(f+".zst", enc.EncodeAll(b, nil), 0o644); err != nil {
			return err
		}
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	return nil
}
