//go:build tools

// Package tools only records, for `go mod tidy`, which upstream commands this module exists
// to build. It is never compiled (build tag "tools"); ./build runs `go build <package path>`.
package tools

import (
	_ "github.com/coreos/ignition/v2/validate"
)
