package sidecar

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/progress"
	"github.com/elastic-training/elastic-training/internal/tcpstore"
)

// A pod's sidecar hears its ranks' datagrams and writes their report into the job's store, when they changed;
// garbage is ignored; the address must be loopback, or a Unix socket (host networking), which a sidecar that begins
// to serve takes over from the one that ran before in the same pod.
func TestProgressReports(t *testing.T) {
	require.ErrorContains(t, ProgressConfig{Addr: "0.0.0.0:1", RunID: "r"}.check(), "loopback")
	require.NoError(t, ProgressConfig{Addr: "127.0.0.1:1"}.check(), "no run id: into the job's etcd (an MPI job)")
	require.ErrorContains(t, startProgress(t.Context(), &sync.WaitGroup{}, ProgressConfig{Addr: "127.0.0.1:1"}, "", nil, "pod-0", slog.New(slog.DiscardHandler)),
		"no client of")
	require.ErrorContains(t, ProgressConfig{Addr: "unix:relative.sock", RunID: "r"}.check(), "absolute path")

	for _, network := range []string{"udp", "unixgram"} {
		t.Run(network, func(t *testing.T) {
			writes := make(chan string, 16)
			srv, err := tcpstore.New(tcpstore.Config{OnSet: func(key string, value []byte) { writes <- key + " " + string(value) }})
			require.NoError(t, err)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			t.Cleanup(func() { cancel(); ln.Close(); wg.Wait() })
			go srv.Serve(ctx, ln)

			var addr, dial string
			stopBefore := func() {}
			if network == "udp" {
				probe, err := net.ListenPacket("udp", "127.0.0.1:0") // a free port, given back
				require.NoError(t, err)
				addr = probe.LocalAddr().String()
				probe.Close()
				dial = addr
			} else {
				dial = filepath.Join(t.TempDir(), "progress.sock")
				addr = constants.UnixAddrPrefix + dial
				// The mode before (a follow) heard at the same socket; it ends after the next has taken the path.
				before, stop := context.WithCancel(ctx)
				var bwg sync.WaitGroup
				require.NoError(t, startProgress(before, &bwg, ProgressConfig{Addr: addr, RunID: "run"}, ln.Addr().String(), nil, "pod-0", slog.New(slog.DiscardHandler)))
				stopBefore = func() { stop(); bwg.Wait() }
				t.Cleanup(stopBefore)
			}
			c := ProgressConfig{Addr: addr, RunID: "run", Every: 20 * time.Millisecond}
			require.NoError(t, c.check())
			require.NoError(t, startProgress(ctx, &wg, c, ln.Addr().String(), nil, "pod-0", slog.New(slog.DiscardHandler)))
			stopBefore()
			if network == "unixgram" {
				fi, err := os.Stat(dial)
				require.NoError(t, err)
				require.Equal(t, os.FileMode(0o666), fi.Mode().Perm(), "any user of the pod (the trainer's) may send")
			}
			send, err := net.Dial(network, dial)
			require.NoError(t, err)
			defer send.Close()
			for _, m := range []string{"garbage", "et1 0 7 100", "et1 1 6"} {
				_, err := send.Write([]byte(m))
				require.NoError(t, err)
			}
			var last string
			require.Eventually(t, func() bool {
				for {
					select {
					case w := <-writes:
						last = w
					default:
						return len(last) > 0 && func() bool {
							key, value, _ := strings.Cut(last, " ")
							r, err := progress.ParseReport([]byte(value))
							return key == "/elastic-training/run/progress/pod-0" && err == nil && len(r.Ranks) == 2 && r.Ranks[0].Step == 7 && r.Ranks[0].Total == 100
						}()
					}
				}
			}, 5*time.Second, 20*time.Millisecond, "last write %q", last)
		})
	}
}

// A Unix socket's path: taken over from this sidecar's own earlier socket (not unlinked when that one closes), never
// from a file that is not a socket.
func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.sock")
	first, _, err := listenUnix("unix", path)
	require.NoError(t, err)
	second, _, err := listenUnix("unix", path)
	require.NoError(t, err)
	defer second.Close()
	require.NoError(t, first.Close())
	go func() {
		if c, err := second.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	require.NoError(t, err, "the second listener's socket outlives the first's close")
	c.Close()

	plain := filepath.Join(dir, "plain")
	require.NoError(t, os.WriteFile(plain, []byte("x"), 0o644))
	_, _, err = listenUnix("unixgram", plain)
	require.ErrorContains(t, err, "not a socket")
}
