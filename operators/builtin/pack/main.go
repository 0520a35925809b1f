// Command pack compresses the example operators built by build.sh: every
// NAME.wasm in a folder becomes NAME.wasm.zst (zstd, best compression, one
// encoder thread, so the bytes are the same on every run) and the .wasm is
// removed. The cairn binary embeds the .zst files: uncompressed, the seven
// modules (each with its own Go runtime) were 19 MiB of a 52.6 MiB binary.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/zstd"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pack DIR")
		os.Exit(2)
	}
	files, err := filepath.Glob(filepath.Join(os.Args[1], "*.wasm"))
	if err != nil || len(files) == 0 {
		fmt.Fprintln(os.Stderr, "pack: no .wasm files in", os.Args[1])
		os.Exit(1)
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBestCompression), zstd.WithEncoderConcurrency(1))
	if err != nil {
		fmt.Fprintln(os.Stderr, "pack:", err)
		os.Exit(1)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil {
			err = os.WriteFile(f+".zst", enc.EncodeAll(b, nil), 0o644)
		}
		if err == nil {
			err = os.Remove(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "pack:", err)
			os.Exit(1)
		}
	}
}
