//go:build tools

// Package tools only records, for `go mod tidy`, the upstream command this module exists
// to build: CoreDNS, the labs' cluster DNS (../run build_coredns runs `go build` of it).
package tools

import (
	_ "github.com/coredns/coredns"
)
