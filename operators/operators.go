// Package operators holds the guest side of cairn: the SDK operator authors
// import (operators/sdk), the ABI's byte format (operators/abi), the example
// operators (operators/examples) and their compiled, embedded copies
// (operators/builtin). This file embeds the SDK's sources, so that the cairn
// binary can write them into an operator project that builds offline
// (`cairn new operator`).
package operators

import "embed"

// GoSDK holds the Go SDK's sources (sdk/ and abi/, tests left out), laid
// out as in this module: a project that requires module "cairn" and
// replaces it with a folder holding these files imports
// "cairn/operators/sdk" as the examples do.
//
//go:embed sdk/sdk.go sdk/host_wasip1.go sdk/host_other.go abi/abi.go
var GoSDK embed.FS
