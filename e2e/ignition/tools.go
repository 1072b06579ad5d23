//go:build tools

// Package tools only records, for `go mod tidy`, which upstream commands this module exists
// to build. It is never compiled (build tag "tools"); ./build runs `go build <package path>`.
// Ignition itself (`github.com/coreos/ignition/v2/internal`, a main package) cannot be
// imported from here: its dependencies are required in go.mod by `go get` instead, so do not
// `go mod tidy` this module.
package tools

import (
	_ "github.com/coreos/ignition/v2/validate"
)
