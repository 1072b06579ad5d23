//go:build tools

// Package tools records, for `go mod tidy`, the one command this module exists to build.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
