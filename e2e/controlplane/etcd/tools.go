//go:build tools

// Package tools only records, for `go mod tidy`, that this module exists to
// build etcd (package go.etcd.io/etcd/server/v3 is etcd's main package). It is
// never compiled (build tag "tools"); ../run builds etcd with `go build`.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
