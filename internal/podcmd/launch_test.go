package podcmd

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/membership"
)

func TestHostfileHosts(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct{ text string }{
		"openmpi":  {"b.job slots=2\na.job slots=1\n"},
		"mpich":    {"b.job:2\na.job:1\n"},
		"comments": {"# written by rdzv-sidecar\n\na.job slots=1\n  b.job slots=2  \n"},
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, name)
			require.NoError(t, os.WriteFile(p, []byte(c.text), 0o644))
			hosts, err := hostfileHosts(p)
			require.NoError(t, err)
			require.Equal(t, []string{"a.job", "b.job"}, hosts)
		})
	}
	_, err := hostfileHosts(filepath.Join(dir, "missing"))
	require.ErrorContains(t, err, "the hostfile")
}

// A run waits for the hostfile to list exactly the members, and for each to answer on the SSH port.
func TestLaunchNotReady(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	hf := filepath.Join(t.TempDir(), "hostfile")
	cfg := LaunchConfig{Hostfile: hf, SSHPort: port}
	ms := []membership.Member{{Host: "127.0.0.1", Slots: 1}}
	require.Contains(t, cfg.notReady(context.Background(), ms), "the hostfile")
	require.NoError(t, os.WriteFile(hf, []byte("127.0.0.1 slots=1\n127.0.0.2 slots=1\n"), 0o644))
	require.Contains(t, cfg.notReady(context.Background(), ms), "lists [127.0.0.1 127.0.0.2], the members are [127.0.0.1]")
	require.NoError(t, os.WriteFile(hf, []byte("127.0.0.1 slots=1\n"), 0o644))
	require.Empty(t, cfg.notReady(context.Background(), ms))
	l.Close()
	require.Contains(t, cfg.notReady(context.Background(), ms), "127.0.0.1 does not answer on port "+strconv.Itoa(port))
}
