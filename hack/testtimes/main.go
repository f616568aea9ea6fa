// Command testtimes reads `go test -json` on its standard input, writes the
// tests' output as `go test` would, and ends with where the time went: each
// package's wall time and its slowest top-level tests, slowest first. The
// Makefile's test targets pipe through it, so a CI log says which package and
// which test spend its budget (issue 47: CI is a budget). It exits 1 when a
// test or a package failed, so a pipeline fails as `go test` would.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
)

func main() {
	sum, err := copyEvents(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(2)
	}
	fmt.Fprint(os.Stdout, sum.Table(topTests))
	if sum.Failed {
		os.Exit(1)
	}
}

// topTests is how many of each package's slowest tests the table names.
const topTests = 8

// copyEvents writes each event's output to w and returns the summary. A line
// that is not an event (a build error, which `go test -json` prints as text)
// is written as it is.
func copyEvents(r io.Reader, w io.Writer) (*Summary, error) {
	sum := NewSummary()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	out := bufio.NewWriter(w)
	defer out.Flush()
	for sc.Scan() {
		line := sc.Bytes()
		ev, ok := ParseEvent(line)
		if !ok {
			out.Write(line)
			out.WriteByte('\n')
			if len(line) > 0 {
				sum.Failed = sum.Failed || isBuildFailure(line)
			}
			continue
		}
		if ev.Output != "" {
			out.WriteString(ev.Output)
			// A line at a time: a CI log shows a running test as it runs.
			if err := out.Flush(); err != nil {
				return nil, err
			}
		}
		sum.Add(ev)
	}
	return sum, sc.Err()
}
