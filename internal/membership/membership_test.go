package membership

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDiffAndDescribe(t *testing.T) {
	a := []Member{{Host: "a", Slots: 1}, {Host: "b", Slots: 2}}
	b := []Member{{Host: "b", Slots: 2}, {Host: "c", Slots: 4}}
	joined, left := Diff(a, b)
	require.Equal(t, []string{"c"}, joined)
	require.Equal(t, []string{"a"}, left)
	require.Equal(t, "2 members, 6 slots: b:2 c:4", Describe(b))
}

func TestSameJob(t *testing.T) {
	const self = "llm-worker-1.llm.team-a.svc.cluster.local"
	for _, c := range []struct {
		host string
		ok   bool
	}{
		{"llm-worker-0.llm.team-a.svc.cluster.local", true},
		{"llm-rdzv-0.llm.team-a.svc.cluster.local.", true},
		{"LLM-worker-0.llm.team-a.svc.cluster.local", true},
		{"llm.team-a.svc.cluster.local", false},            // the Service, not a pod under it
		{"llm-rdzv.team-a.svc.cluster.local", false},       // the rendezvous Service: whoever moves it chooses
		{"x.llm.team-b.svc.cluster.local", false},          // another namespace
		{"x.other.team-a.svc.cluster.local", false},        // another job
		{"evil.example.com", false},                        // anywhere
		{"10.244.0.7", false},                              // an address
		{"a.b.llm.team-a.svc.cluster.local", false},        // deeper
		{"x.llm.team-a.svc.cluster.local.evil.com", false}, // a suffix of ours inside another name
		{"x_y.llm.team-a.svc.cluster.local", false},        // not a DNS name
		{"", false},
	} {
		err := SameJob(self, c.host)
		if (err == nil) != c.ok {
			t.Errorf("SameJob(%q): %v, want ok=%v", c.host, err, c.ok)
		}
	}
	if err := SameJob("localhost", "x.localhost"); err == nil {
		t.Error("a pod name without a job's Service accepted")
	}
}
