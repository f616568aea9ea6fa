package sidecar_test

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// TestServeUnderMemoryLimit: serve in a memory cgroup of 256 MiB, as in a
// container with that limit, takes 1,200 compare-and-set writes of a
// 1,024-node torch state through the v2 API (140 KB base64, as torch's
// etcd-v2 backend writes it at every heartbeat and join), of which its v2
// store keeps the last 1,000, and stays up under the limit. Go's heap would
// double past the limit before collecting (without the soft limit that
// serve sets from its cgroup, the kernel killed it at write 988 in one run, 1,175
// in another).
func TestServeUnderMemoryLimit(t *testing.T) {
	const limit = 256 << 20
	s := newServe(t, "--c10d-addr=")
	s.cgroup = testenv.MemoryCgroup(t, limit)
	s.start(t)
	require.Contains(t, s.Output(), fmt.Sprintf("gomemlimit=%d", limit*9/10), "serve did not set its heap's soft limit from its cgroup")

	raw := make([]byte, 105_000) // torch's state of 1,024 nodes, about 140 KB once base64-encoded
	rand.Read(raw)
	state := base64.StdEncoding.EncodeToString(raw)
	key := s.URL + "/v2/keys/torch/elastic/rendezvous/scale/state"
	prev := ""
	for i := range 1200 {
		next := fmt.Sprintf("%s%08d", state[:len(state)-8], i)
		form := url.Values{"value": {next}}
		if prev != "" {
			form.Set("prevValue", prev)
		}
		req, err := http.NewRequest(http.MethodPut, key, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err, "write %d: serve gone?\n%s", i, s.Output())
		resp.Body.Close()
		require.Contains(t, []int{http.StatusOK, http.StatusCreated}, resp.StatusCode, "write %d", i)
		prev = next
	}
	hwm, err := testenv.StatusBytes(s.Cmd.Process.Pid, "VmHWM")
	require.NoError(t, err, "serve gone?\n%s", s.Output())
	t.Logf("serve's peak RSS after 1,200 writes of %d bytes: %.1f MiB (cgroup limit %d MiB)", len(state), float64(hwm)/(1<<20), limit>>20)
	waitReady(t, s.Proc, s.Health)
}
