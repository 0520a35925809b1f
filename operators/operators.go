// Package operators holds the guest side of cairn: the SDK operator authors
// import (operators/sdk), the ABI's byte format (operators/abi), the example
// operators (operators/examples) and their compiled, embedded copies
// (operators/builtin), and the SDKs for Rust (operators/sdk-rust), C
// (operators/sdk-c) and AssemblyScript (operators/sdk-as) with their
// examples (operators/examples-rust, examples-c, examples-as). This file
// embeds the SDKs' sources, so that the cairn binary can write them into an
// operator project that builds offline (`cairn new operator --lang
// go|rust|c|as`).
package operators

import "embed"

// GoSDK holds the Go SDK's sources (sdk/ and abi/, tests left out), laid
// out as in this module: a project that requires module "cairn" and
// replaces it with a folder holding these files imports
// "cairn/operators/sdk" as the examples do.
//
//go:embed sdk/sdk.go sdk/host_wasip1.go sdk/host_other.go abi/abi.go
var GoSDK embed.FS

// RustSDK holds the Rust SDK: cairn.rs (the module an operator declares
// with `mod cairn;`) and rustc.sh (the shell function that runs rustc for
// wasm32-wasi with the right flags).
//
//go:embed sdk-rust/cairn.rs sdk-rust/rustc.sh
var RustSDK embed.FS

// CSDK holds the C SDK: cairn.h and cairn.c.
//
//go:embed sdk-c/cairn.h sdk-c/cairn.c
var CSDK embed.FS

// ASSDK holds the AssemblyScript SDK: cairn.ts.
//
//go:embed sdk-as/cairn.ts
var ASSDK embed.FS
