package framework

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Option changes what Main does.
type Option struct{ after afterCheck }

type afterCheck struct {
	name  string
	check func(c *Cluster, log io.Writer) error
}

// After makes Main run check once every test of the binary has run (m.Run), whatever the tests' names or files:
// the place for a check that must come last, such as one that stops the cluster (Main starts it again if it was
// running before the tests). It runs as a test called name would: only when -run selects name and -skip does
// not, reported in `go test`'s words; a non-nil error fails the test binary. What check writes to log is shown
// with -v or when it fails.
func After(name string, check func(c *Cluster, log io.Writer) error) Option {
	return Option{after: afterCheck{name: name, check: check}}
}

// run runs the check if the test flags select it, and reports whether it passed.
func (a afterCheck) run(c *Cluster) bool {
	if !selected(a.name) {
		return true
	}
	if testing.Verbose() {
		fmt.Printf("=== RUN   %s\n", a.name)
	}
	start := time.Now()
	var log bytes.Buffer
	err := a.check(c, &log)
	if err != nil {
		fmt.Fprintf(&log, "%v\n", err)
	}
	if err == nil && !testing.Verbose() {
		return true
	}
	verdict := "PASS"
	if err != nil {
		verdict = "FAIL"
	}
	fmt.Printf("--- %s: %s (%.2fs)\n", verdict, a.name, time.Since(start).Seconds())
	if s := strings.TrimRight(log.String(), "\n"); s != "" {
		fmt.Printf("    %s\n", strings.ReplaceAll(s, "\n", "\n    "))
	}
	if err != nil {
		fmt.Println("FAIL")
	}
	return err == nil
}

// selected reports whether the test flags (-run, -skip, -list) would run a top-level test called name.
func selected(name string) bool {
	value := func(f string) string {
		if fl := flag.Lookup(f); fl != nil {
			return fl.Value.String()
		}
		return ""
	}
	if value("test.list") != "" {
		return false
	}
	match := func(pattern string) bool {
		top, _, _ := strings.Cut(pattern, "/")
		ok, err := regexp.MatchString(top, name)
		return err == nil && ok
	}
	if run := value("test.run"); run != "" && !match(run) {
		return false
	}
	if skip := value("test.skip"); skip != "" && match(skip) {
		return false
	}
	return true
}
