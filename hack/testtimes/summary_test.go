package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const stream = `{"Action":"start","Package":"a/fast"}
{"Action":"run","Package":"a/fast","Test":"TestOne"}
{"Action":"output","Package":"a/fast","Test":"TestOne","Output":"=== RUN   TestOne\n"}
{"Action":"pass","Package":"a/fast","Test":"TestOne","Elapsed":2.5}
{"Action":"pass","Package":"a/fast","Test":"TestOne/sub","Elapsed":2.4}
{"Action":"pass","Package":"a/fast","Elapsed":3}
# a/broken
broken.go:1:1: expected 'package'
{"Action":"run","Package":"a/slow","Test":"TestSlow"}
{"Action":"fail","Package":"a/slow","Test":"TestSlow","Elapsed":40.25}
{"Action":"pass","Package":"a/slow","Test":"TestQuick","Elapsed":0.1}
{"Action":"fail","Package":"a/slow","Elapsed":41}
`

func TestCopyEvents(t *testing.T) {
	var out bytes.Buffer
	sum, err := copyEvents(strings.NewReader(stream), &out)
	require.NoError(t, err)
	assert.True(t, sum.Failed)
	assert.Equal(t, "=== RUN   TestOne\n# a/broken\nbroken.go:1:1: expected 'package'\n", out.String(),
		"events' output and non-event lines, in order")
	want := `
== time per package (wall seconds; packages may overlap) ==
     41.0  fail  a/slow
     40.2  fail      TestSlow
      3.0  pass  a/fast
      2.5  pass      TestOne
     44.0  sum of 2 packages
`
	assert.Equal(t, want, sum.Table(topTests), "slowest first; subtests and tests under a second left out")
}

// A test whose subtests run in parallel reports 0.00s of its own (its body
// only starts them); a parallel test waits paused before it continues.
func TestWallTimeOfParallelTests(t *testing.T) {
	const parallel = `{"Time":"2026-12-04T10:00:00Z","Action":"run","Package":"p","Test":"TestSuites"}
{"Time":"2026-12-04T10:00:00Z","Action":"run","Package":"p","Test":"TestSuites/a"}
{"Time":"2026-12-04T10:00:00Z","Action":"pause","Package":"p","Test":"TestSuites/a"}
{"Time":"2026-12-04T10:00:00Z","Action":"run","Package":"p","Test":"TestLater"}
{"Time":"2026-12-04T10:00:00Z","Action":"pause","Package":"p","Test":"TestLater"}
{"Time":"2026-12-04T10:00:00Z","Action":"cont","Package":"p","Test":"TestSuites/a"}
{"Time":"2026-12-04T10:04:25Z","Action":"pass","Package":"p","Test":"TestSuites/a","Elapsed":265}
{"Time":"2026-12-04T10:04:25Z","Action":"pass","Package":"p","Test":"TestSuites","Elapsed":0}
{"Time":"2026-12-04T10:04:25Z","Action":"cont","Package":"p","Test":"TestLater"}
{"Time":"2026-12-04T10:04:35Z","Action":"pass","Package":"p","Test":"TestLater","Elapsed":10}
{"Time":"2026-12-04T10:04:35Z","Action":"pass","Package":"p","Elapsed":275}
`
	sum, err := copyEvents(strings.NewReader(parallel), &bytes.Buffer{})
	require.NoError(t, err)
	want := `
== time per package (wall seconds; packages may overlap) ==
    275.0  pass  p
    265.0  pass      TestSuites
     10.0  pass      TestLater
    275.0  sum of 1 packages
`
	assert.Equal(t, want, sum.Table(topTests), "from its last run or cont to its end")
}

func TestPassingStreamDoesNotFail(t *testing.T) {
	sum, err := copyEvents(strings.NewReader(`{"Action":"pass","Package":"p","Elapsed":1}`+"\n"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.False(t, sum.Failed)
	assert.Empty(t, NewSummary().Table(topTests), "no packages, no table")
}

func TestBuildFailureFails(t *testing.T) {
	sum, err := copyEvents(strings.NewReader("FAIL\ta/broken [build failed]\n"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.True(t, sum.Failed)
}

func FuzzParseEvent(f *testing.F) {
	for _, l := range strings.Split(stream, "\n") {
		f.Add([]byte(l))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, ok := ParseEvent(line)
		if !ok {
			assert.Equal(t, Event{}, ev)
			return
		}
		s := NewSummary()
		s.Add(ev)
		_ = s.Table(topTests)
	})
}
