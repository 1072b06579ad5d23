//go:build tools

// Package tools only records, for `go mod tidy`, which upstream commands this
// module exists to build: the daemon, its runc shim (the one Debian's 1.6
// package ships is not used with 2.x) and ctr. It is never compiled (build tag
// "tools"); the binaries are built by ../run with `go build <package path>`.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
