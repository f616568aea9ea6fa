package sidecar_test

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastic-training/elastic-training/internal/tcpstore"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// BenchmarkC10dJoinRace: torch's join race with the participants' own cost
// taken out, so that only the store's share is left. N Go clients join one
// key as torch's dynamic rendezvous does on c10d: each reads the state, adds
// its node (140 bytes, a node's share of torch's base64-encoded state) and
// writes it with COMPARE_SET, the state it read as the expected value (so an
// attempt carries the state twice and its reply once more); on a lost race it
// retries at once with the state the reply returned, as torch does. Time
// until all N are in, attempts, the server's CPU: the sidecar vs torch's
// server in the same run. BenchmarkRendezvousScale has what torch's Python
// participants add.
func BenchmarkC10dJoinRace(b *testing.B) {
	raiseNoFile(b)
	sizes := knob(b, "RACE_NODES", []int{256, 512, 1024}, counts)
	timeout := knob(b, "RACE_TIMEOUT", 3*time.Minute, time.ParseDuration)
	fmt.Println("== torch's join race on c10d with Go clients (no pickling, no GIL): N nodes each add 140 bytes to one " +
		"key by COMPARE_SET, retrying at once on a lost race; the sidecar's store vs torch's TCPStore server")
	findTorch(b)
	for i, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			res := map[string]raceResult{}
			for _, kind := range alternate(i, storeKinds...) {
				s := startStore(b, kind)
				res[kind] = joinRace(b, s, n, timeout)
				s.Stop(grace)
				fmt.Printf("   N=%-5d %-8s: %s\n", n, kind, res[kind])
			}
			sc, tr := res["sidecar"], res["torch"]
			if sc.joined == n && tr.joined == n {
				r := sc.took.Seconds() / tr.took.Seconds()
				fmt.Printf("   N=%-5d ratio   : %.2f (goal ≤ 1.10)  %s\n", n, r, goal(r <= 1.10))
				b.ReportMetric(r, "time-ratio")
				b.ReportMetric(sc.took.Seconds(), "sidecar-s")
			}
		})
	}
}

type raceResult struct {
	joined, n int
	took      time.Duration
	attempts  int64
	serverCPU float64 // core-seconds
}

func (r raceResult) String() string {
	state := ""
	if r.joined < r.n {
		state = fmt.Sprintf(" NOT ALL: %d of %d in after", r.joined, r.n)
	}
	return fmt.Sprintf("%s%7.2fs, %7d attempts (%.0f per node), server %.1f CPU-seconds", state, r.took.Seconds(), r.attempts,
		float64(r.attempts)/float64(r.n), r.serverCPU)
}

// joinRace runs one race of n clients on s, until all are in or timeout.
func joinRace(b *testing.B, s *store, n int, timeout time.Duration) raceResult {
	b.Helper()
	const key = "torch.rendezvous.race.state"
	cs, err := dialMany(s.addr, n)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	// SET has no reply: a GET on the same connection shows it stored before
	// the race starts (torch's classic server drops a connection that GETs a
	// missing key; torch's clients WAIT for it first).
	if err := cs[0].Do(&tcpstore.Request{Op: tcpstore.OpSet, Key: key, Value: []byte("state:")}); err != nil {
		b.Fatal(err)
	}
	if err := cs[0].Send(&tcpstore.Request{Op: tcpstore.OpGet, Key: key}); err != nil {
		b.Fatal(err)
	}
	if _, err := cs[0].Value(); err != nil {
		b.Fatal(err)
	}
	cpu0, err := testenv.CPUSeconds(s.Cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	var attempts atomic.Int64
	var joined atomic.Int32
	deadline := time.Now().Add(timeout)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, c := range cs {
		wg.Go(func() {
			c.Conn().SetDeadline(deadline)
			node := []byte(fmt.Sprintf("%0140d", i))
			<-start
			if err := c.Send(&tcpstore.Request{Op: tcpstore.OpGet, Key: key}); err != nil {
				errs <- err
				return
			}
			state, err := c.Value()
			for err == nil {
				if bytes.Contains(state, node) {
					joined.Add(1)
					return
				}
				desired := append(state[:len(state):len(state)], node...)
				attempts.Add(1)
				if err = c.Send(&tcpstore.Request{Op: tcpstore.OpCompareSet, Key: key, Expected: state, Value: desired}); err == nil {
					state, err = c.Value()
				}
			}
			if time.Now().Before(deadline) {
				errs <- fmt.Errorf("client %d, after %d bytes of state: %w", i, len(state), err)
			}
		})
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	took := time.Since(t0)
	close(errs)
	for err := range errs {
		b.Fatalf("%s: %v\n%s", s.Name, err, tail(s.Output(), 2000))
	}
	cpu1, err := testenv.CPUSeconds(s.Cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	return raceResult{joined: int(joined.Load()), n: n, took: took, attempts: attempts.Load(), serverCPU: cpu1 - cpu0}
}
