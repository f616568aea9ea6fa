package membership

import (
	"strings"
	"testing"
)

// FuzzSameJob: whatever a store names as its server (the verifying sidecar's input, written by whoever reached the
// store), SameJob never panics, and what it accepts is a single label under this pod's job.
func FuzzSameJob(f *testing.F) {
	const self = "llm-worker-1.llm.ml.svc.cluster.local"
	for _, s := range []string{"llm-worker-0.llm.ml.svc.cluster.local", "evil.example.com", "", ".", "a..b", "x.llm.ml.svc.cluster.local.evil", strings.Repeat("a.", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		if SameJob(self, host) != nil {
			return
		}
		label, rest, ok := strings.Cut(strings.TrimSuffix(host, "."), ".")
		if !ok || label == "" || strings.Contains(label, ".") || !strings.EqualFold(rest, "llm.ml.svc.cluster.local") {
			t.Fatalf("accepted %q", host)
		}
	})
}
