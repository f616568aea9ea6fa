package sidecar_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/trainerpy"
)

// torch's own LocalElasticAgent tests (its
// test/distributed/elastic/agent/server/test/local_elastic_agent_test.py, which
// hack/torch-tests.sh takes from Debian's source package) run against the
// elastic-training backend: every scenario of the file, each agent a node with
// an address and a joining sidecar of its own (testdata/torch_agent_suite.py
// says how). torch 2.6 runs its own file; torch 2.14 runs the newest file the
// mirror has. The two run at once: most of their time is waiting (barriers,
// sleeps, leases), and each has sidecars and addresses of its own.
func TestTorchAgentTests(t *testing.T) {
	t.Parallel() // see TestMain
	for _, suite := range []string{testenv.SuiteTrixie, testenv.SuiteForky} {
		tr := newTrainer(t, suite)
		t.Run(tr.name(), func(t *testing.T) {
			t.Parallel()
			src := testenv.TorchTestFile(t, tr.version, testenv.TorchAgentTest)
			// The cache is not bound into the root filesystem; the test's temporary directory is.
			text, err := os.ReadFile(src)
			require.NoError(t, err)
			file := filepath.Join(t.TempDir(), filepath.Base(src))
			require.NoError(t, os.WriteFile(file, text, 0o644))
			files := t.TempDir()
			require.NoError(t, trainerpy.Install(files))
			runner, err := filepath.Abs("testdata/torch_agent_suite.py")
			require.NoError(t, err)
			cmd := tr.command("/usr/bin/python3", runner)
			cmd.Env = torchrunEnv("ET_TORCH_AGENT_TEST="+file, "ET_SIDECAR="+sidecarBin, "ET_WORK="+t.TempDir(),
				"PYTHONPATH="+filepath.Join(files, trainerpy.Dir))
			p := testenv.Start(t, "torch's agent tests", cmd)
			err = p.Wait(t, 20*time.Minute)
			out := p.Output()
			t.Logf("torch %s, %s:\n%s", tr.version, src, summary(out))
			require.NoError(t, err, "torch's agent tests failed on the elastic-training backend:\n%s", out)
			require.Regexp(t, `(?m)^Ran ([2-9]\d|1\d\d) tests in`, out, "every scenario of torch's file ran")
		})
	}
}

var unittestLine = regexp.MustCompile(`(?m)^(test_\S+ \(.*\) \.\.\. .*|Ran \d+ tests.*|OK.*|FAILED.*)$`)

// summary is unittest's verdict per test and its totals.
func summary(out string) string {
	return strings.Join(unittestLine.FindAllString(out, -1), "\n")
}
