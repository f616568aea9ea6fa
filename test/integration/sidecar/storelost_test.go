package sidecar_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// A store that stops answering (its node lost: no FIN, no RST) must fail the
// agents that reach it through their pod's sidecar at once, so that torchrun
// exits and the kubelet restarts it into the next store's rendezvous.
// torch's own client is the anchor, measured in the same run: after its wait
// times out it reads CANCEL_WAIT's answer with no timeout, and stays blocked.
// SIGSTOP stands for the lost node: the store's kernel still acknowledges
// what is sent, nothing answers, nothing closes (test/e2e's TestNodeLoss
// crashes a real node).
func TestStoreLostFailsAgentsFast(t *testing.T) {
	forEachTorch(t, testStoreLost)
}

func testStoreLost(t *testing.T, tr trainer) {
	{
		s := startServe(t)
		proxy := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		startJoin(t, s.URL, "agent-a.example", 1, "", "--c10d-addr="+proxy, "--c10d-upstream="+s.C10d)
		env := torchrunEnv("TRAIN_STEPS=100000", "STEP_SLEEP=0.2")
		args := append(testenv.TorchrunArgs("c10d", s.rdzvEndpoint("c10d"), "lost-store", "2"), trainScript(t))
		viaProxy := make([]string, len(args))
		for i, a := range args {
			viaProxy[i] = strings.Replace(a, "--rdzv_endpoint="+s.C10d, "--rdzv_endpoint="+proxy, 1)
		}
		a := tr.startAgent(t, "agent-a (through its sidecar)", env, viaProxy...)
		b := tr.startAgent(t, "agent-b (torch's own client)", env, args...)
		for _, p := range []*testenv.Proc{a, b} {
			testenv.Eventually(t, 120*time.Second, p.Name+" training at world 2", func() error {
				if !strings.Contains(p.Output(), "world=2") {
					return fmt.Errorf("no step at world 2 yet:\n%s", p.Output())
				}
				return nil
			})
		}

		s.Signal(syscall.SIGSTOP)
		lost := time.Now()
		t.Cleanup(func() { s.Signal(syscall.SIGCONT) })
		err := a.Wait(t, 90*time.Second)
		took := time.Since(lost)
		require.Error(t, err, "agent-a must fail once its store is lost:\n%s", a.Output())
		require.Contains(t, a.Output(), "RendezvousConnectionError", "agent-a must fail on its store connection")
		select {
		case <-b.Done():
			t.Fatalf("agent-b (torch's own client) ended too, so the test shows nothing: %v\n%s", b.Err(), b.Output())
		default:
		}
		t.Logf("%s: store lost: the agent through its sidecar failed after %.1f s (lease TTL 2 s); torch's own client still blocked", tr.name(), took.Seconds())
	}
}
