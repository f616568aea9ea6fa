// Package tcpstore_test checks internal/tcpstore against torch's own
// TCPStore client and server: torch 2.14 (Debian forky) and 2.6 (trixie),
// from the trainer root filesystems (testenv.Rootfs; the tests need root).
// One scenario (testdata/scenario.py) runs against torch's server and
// against ours (tcpstoretest's StartTorch and Start), and every result must
// be the same, but for the differences knownDifferences lists.
package tcpstore_test

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/elastic-training/elastic-training/internal/tcpstore"
	"github.com/elastic-training/elastic-training/internal/tcpstore/tcpstoretest"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// knownDifferences are the scenario's results where our server answers
// differently from torch's classic server, on purpose: key -> (torch's, ours).
var knownDifferences = map[string]struct{ torch, ours any }{
	// The classic server does not wake waiters when COMPARE_SET creates a key;
	// torch's libuv server (the default of pip builds since 2.4) and ours do.
	"wait woken by compare_set creating the key": {
		torch: map[string]any{"error": "DistStoreError", "msg": "wait timeout after 3000ms, keys: /w-cs"},
		ours:  nil,
	},
}

func TestConformance(t *testing.T) {
	for _, suite := range []string{testenv.SuiteForky, testenv.SuiteTrixie} {
		root := testenv.Rootfs(t, suite)
		version := testenv.TorchVersion(t, root)
		t.Run("torch-"+testenv.ShortVersion(version), func(t *testing.T) {
			testConformance(t, root, version)
		})
	}
}

func testConformance(t *testing.T, root, version string) {
	torchAddr, _ := tcpstoretest.StartTorch(t, root)
	ours := tcpstoretest.Start(t, tcpstore.Config{})

	// The two runs are independent: run them at once.
	var (
		wg                   sync.WaitGroup
		torchRes, oursRes    map[string]any
		torchOut, oursOutput string
	)
	wg.Go(func() { torchRes, torchOut = runScenario(t, root, "scenario-torch", torchAddr) })
	wg.Go(func() { oursRes, oursOutput = runScenario(t, root, "scenario-ours", ours.Addr) })
	wg.Wait()
	if torchRes == nil || oursRes == nil {
		t.Fatalf("a scenario gave no result\ntorch's server:\n%s\nours:\n%s\nour server's log:\n%s",
			torchOut, oursOutput, ours.Log.String())
	}
	t.Logf("torch %s: %d results compared", version, len(torchRes))

	for key, want := range knownDifferences {
		if d := cmp.Diff(want.torch, torchRes[key]); d != "" {
			t.Errorf("%q from torch's server, a known difference, changed (-want +got):\n%s", key, d)
		}
		if d := cmp.Diff(want.ours, oursRes[key]); d != "" {
			t.Errorf("%q from our server (-want +got):\n%s", key, d)
		}
		delete(torchRes, key)
		delete(oursRes, key)
	}
	if d := cmp.Diff(torchRes, oursRes); d != "" {
		t.Errorf("results differ (-torch's server +ours):\n%s\nour server's log:\n%s", d, ours.Log.String())
	}

	// The scenario reached every message type the client sends.
	want := []string{"VALIDATE", "PING", "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS",
		"DELETE_KEY", "APPEND", "MULTI_GET", "MULTI_SET", "CANCEL_WAIT"}
	if strings.HasPrefix(version, "2.14") {
		want = append(want, "LIST_KEYS", "BARRIER")
	}
	ops := ours.OpsServed(t)
	for _, op := range want {
		if ops[op] == 0 {
			t.Errorf("the scenario sent no %s (ops served: %v)", op, ops)
		}
	}
	t.Logf("requests our server served: %v", ops)
}

// runScenario runs testdata/scenario.py against addr and returns its
// results (nil if it printed none) and its output.
func runScenario(t *testing.T, root, name, addr string) (map[string]any, string) {
	host, port, _ := net.SplitHostPort(addr)
	cmd := testenv.InRootfs(root, "/usr/bin/python3", testdata(t, "scenario.py"), host, port)
	cmd.Env = testenv.TorchEnv()
	p := testenv.Start(t, name, cmd)
	select {
	case <-p.Done():
	case <-time.After(5 * time.Minute):
		p.Kill()
		<-p.Done()
		return nil, p.Output() + "\n(killed after 5 minutes)"
	}
	out := p.Output()
	for line := range strings.Lines(out) {
		if rest, ok := strings.CutPrefix(line, "RESULT "); ok {
			var res map[string]any
			if err := json.Unmarshal([]byte(rest), &res); err != nil {
				return nil, fmt.Sprintf("%s\n(bad RESULT line: %v)", out, err)
			}
			return res, out
		}
	}
	return nil, fmt.Sprintf("%s\n(exit: %v)", out, p.Err())
}

func testdata(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}
