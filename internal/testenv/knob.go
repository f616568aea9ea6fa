package testenv

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// Knob is a benchmark's setting from the environment variable name, read with parse; def when it is unset or
// empty. A value that does not parse fails the benchmark, naming the variable.
func Knob[T any](tb testing.TB, name string, def T, parse func(string) (T, error)) T {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		tb.Fatalf("%s=%q: %v", name, v, err)
	}
	return x
}

// Ints parses a comma-separated list of whole numbers ("64,512,2048").
func Ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// Str is the identity parse, for Knob of a string.
func Str(s string) (string, error) { return s, nil }
