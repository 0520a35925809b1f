// Command cairn is a single-binary stateful stream processor: it consumes
// NATS JetStream, runs WebAssembly operators over keyed state in Pebble, and
// checkpoints that state to a local path or S3. See README.md.
package main

import (
	"os"

	"cairn/internal/app/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
