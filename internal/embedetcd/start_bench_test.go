package embedetcd

import (
	"fmt"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// BenchmarkStoreStart measures how long the store takes from its start until it serves (etcd's ReadyNotify: its
// one member elected itself and published itself), with etcd's default ticks (100 ms, election after 10) as the
// baseline and with ours, alternately in the same run: the time every pod of a job waits at install and at a
// standby's takeover. Run with `make bench-sidecar`, or `go test -run '^$' -bench StoreStart -benchtime 20x
// ./internal/embedetcd`.
func BenchmarkStoreStart(b *testing.B) {
	var took [2][]time.Duration
	for i := 0; i < b.N; i++ {
		for j, defaults := range []bool{true, false} {
			took[j] = append(took[j], startOnce(b, defaults))
		}
	}
	base, ours := testenv.Median(took[0]), testenv.Median(took[1])
	fmt.Printf("store start until it serves, median of %d: etcd's ticks %v, ours %v, ratio %.2f\n",
		b.N, base.Round(time.Millisecond), ours.Round(time.Millisecond), ours.Seconds()/base.Seconds())
	b.ReportMetric(float64(ours.Milliseconds()), "ms-ours")
	b.ReportMetric(float64(base.Milliseconds()), "ms-etcd-defaults")
	b.ReportMetric(ours.Seconds()/base.Seconds(), "ratio")
}

// startOnce starts a fresh store, with etcd's default ticks or ours, and returns the time until it serves.
func startOnce(b *testing.B, etcdDefaults bool) time.Duration {
	b.Helper()
	u := func(port int) url.URL { return url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)} }
	client, peer := u(testenv.FreePort(b)), u(testenv.FreePort(b))
	s := New(Config{Name: "b", DataDir: b.TempDir(), ListenClientURLs: []url.URL{client}, AdvertiseClientURLs: []url.URL{client},
		ListenPeerURLs: []url.URL{peer}, UnsafeNoFsync: true, Log: slog.New(slog.DiscardHandler)})
	ec, err := s.embedConfig(nil)
	if err != nil {
		b.Fatal(err)
	}
	if etcdDefaults {
		d := embed.NewConfig()
		ec.TickMs, ec.ElectionMs = d.TickMs, d.ElectionMs
	}
	start := time.Now()
	e, err := embed.StartEtcd(ec)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		return time.Since(start)
	case <-time.After(30 * time.Second):
		b.Fatal("the store did not serve within 30 s")
	}
	return 0
}
