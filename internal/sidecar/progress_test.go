package sidecar

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/progress"
	"github.com/elastic-training/elastic-training/internal/tcpstore"
)

// A pod's sidecar hears its ranks' datagrams and writes their report into the job's store, when they changed;
// garbage is ignored; the address must be loopback.
func TestProgressReports(t *testing.T) {
	require.ErrorContains(t, ProgressConfig{Addr: "0.0.0.0:1", RunID: "r"}.check(), "loopback")
	require.ErrorContains(t, ProgressConfig{Addr: "127.0.0.1:1"}.check(), "--run-id")

	writes := make(chan string, 16)
	srv, err := tcpstore.New(tcpstore.Config{OnSet: func(key string, value []byte) { writes <- key + " " + string(value) }})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); ln.Close(); wg.Wait() })
	go srv.Serve(ctx, ln)

	probe, err := net.ListenPacket("udp", "127.0.0.1:0") // a free port, given back
	require.NoError(t, err)
	addr := probe.LocalAddr().String()
	probe.Close()
	c := ProgressConfig{Addr: addr, RunID: "run", Every: 20 * time.Millisecond}
	require.NoError(t, c.check())
	require.NoError(t, startProgress(ctx, &wg, c, ln.Addr().String(), "pod-0", slog.New(slog.DiscardHandler)))
	send, err := net.Dial("udp", addr)
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
}
