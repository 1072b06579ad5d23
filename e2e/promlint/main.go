// promlint checks Prometheus text-format metrics on stdin as `promtool check metrics` does:
// the same linter (client_golang's promlint), built from the module go.mod pins. Exit 0:
// clean; 1: problems (one per line); 2: the input does not parse.
package main

import (
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

func main() {
	problems, err := promlint.New(os.Stdin).Lint()
	if err != nil {
		fmt.Fprintf(os.Stderr, "promlint: the metrics do not parse: %v\n", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Printf("%s: %s\n", p.Metric, p.Text)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}
