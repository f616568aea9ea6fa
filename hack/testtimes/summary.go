package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Event is the part of test2json's event that the summary reads.
type Event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64 // seconds, on pass, fail and skip
	Output  string
	Time    time.Time
}

// ParseEvent decodes one line of `go test -json`; ok is false for anything
// else (text that go test prints outside events).
func ParseEvent(line []byte) (Event, bool) {
	var ev Event
	if len(line) == 0 || line[0] != '{' {
		return ev, false
	}
	if err := json.Unmarshal(line, &ev); err != nil || ev.Action == "" {
		return Event{}, false
	}
	return ev, true
}

// isBuildFailure: the text lines `go test -json` prints for a package that does
// not build (the event stream then reports the package's fail too, but not on
// every go version).
func isBuildFailure(line []byte) bool {
	return bytes.HasPrefix(line, []byte("FAIL")) || bytes.Contains(line, []byte("[build failed]"))
}

// Result is one package's or one test's outcome.
type Result struct {
	Name    string
	Action  string // pass, fail, skip, or "" while it runs
	Elapsed float64
}

// Summary collects packages and their top-level tests in the order they end.
type Summary struct {
	Failed   bool
	packages map[string]*Result
	order    []string
	tests    map[string][]Result  // package -> its top-level tests
	started  map[string]time.Time // package + "\x00" + test -> its last run or cont
}

// NewSummary returns an empty summary.
func NewSummary() *Summary {
	return &Summary{packages: map[string]*Result{}, tests: map[string][]Result{}, started: map[string]time.Time{}}
}

// Add takes one event.
//
// A top-level test's time is its wall time from its last run or cont event to
// its end, where the events carry times: go test's own Elapsed of a test whose
// subtests call t.Parallel is its body's alone (0.00s for a test that only
// starts them), and a parallel test's run-to-end would count the time it waited
// paused.
func (s *Summary) Add(ev Event) {
	key := ev.Package + "\x00" + ev.Test
	switch ev.Action {
	case "pass", "fail", "skip":
	case "run", "cont":
		if ev.Test != "" && !strings.Contains(ev.Test, "/") && !ev.Time.IsZero() {
			s.started[key] = ev.Time
		}
		return
	default:
		return
	}
	if ev.Action == "fail" {
		s.Failed = true
	}
	if ev.Test == "" {
		if _, seen := s.packages[ev.Package]; !seen {
			s.order = append(s.order, ev.Package)
		}
		s.packages[ev.Package] = &Result{Name: ev.Package, Action: ev.Action, Elapsed: ev.Elapsed}
		return
	}
	if strings.Contains(ev.Test, "/") {
		return // subtests: their top-level test's time holds theirs
	}
	elapsed := ev.Elapsed
	if start, ok := s.started[key]; ok && !ev.Time.IsZero() {
		elapsed = max(elapsed, ev.Time.Sub(start).Seconds())
		delete(s.started, key)
	}
	s.tests[ev.Package] = append(s.tests[ev.Package], Result{Name: ev.Test, Action: ev.Action, Elapsed: elapsed})
}

// Table is the summary as text: packages slowest first, each with its top
// slowest top-level tests, and the sum of the packages' times.
func (s *Summary) Table(top int) string {
	if len(s.order) == 0 {
		return ""
	}
	pkgs := make([]*Result, 0, len(s.order))
	total := 0.0
	for _, name := range s.order {
		pkgs = append(pkgs, s.packages[name])
		total += s.packages[name].Elapsed
	}
	sort.SliceStable(pkgs, func(i, j int) bool { return pkgs[i].Elapsed > pkgs[j].Elapsed })
	var b strings.Builder
	fmt.Fprintf(&b, "\n== time per package (wall seconds; packages may overlap) ==\n")
	for _, p := range pkgs {
		fmt.Fprintf(&b, "%9.1f  %-4s  %s\n", p.Elapsed, p.Action, p.Name)
		tests := append([]Result(nil), s.tests[p.Name]...)
		sort.SliceStable(tests, func(i, j int) bool { return tests[i].Elapsed > tests[j].Elapsed })
		for i, t := range tests {
			if i == top || t.Elapsed < 1 {
				break
			}
			fmt.Fprintf(&b, "%9.1f  %-4s      %s\n", t.Elapsed, t.Action, t.Name)
		}
	}
	fmt.Fprintf(&b, "%9.1f  sum of %d packages\n", total, len(pkgs))
	return b.String()
}
