package tcpstore

import "github.com/prometheus/client_golang/prometheus"

// What the tests in package tcpstore_test (server_test.go, which starts its
// servers with tcpstoretest) read beyond the exported API.

// Reply bytes of CHECK, WAIT, BARRIER and CANCEL_WAIT.
const (
	CheckReady    = checkReady
	CheckNotReady = checkNotReady
	StopWaiting   = stopWaiting
	WaitCanceled  = waitCanceled
)

// Reasons for refusing a client: the refused counter's label.
const (
	RefusedNoValidate = refusedNoValidate
	RefusedBadMagic   = refusedBadMagic
	RefusedUnknownOp  = refusedUnknownOp
	RefusedTooLarge   = refusedTooLarge
	RefusedNotNumber  = refusedNotNumber
)

// TestMetrics are a server's metrics.
type TestMetrics struct {
	Connections, Waiters, Keys prometheus.Gauge
	Ops                        [numOps]prometheus.Counter
	Refused                    *prometheus.CounterVec
	BytesIn, BytesOut          prometheus.Counter
}

func (s *Server) TestMetrics() TestMetrics {
	m := s.m
	return TestMetrics{Connections: m.connections, Waiters: m.waiters, Keys: m.keys, Ops: m.ops,
		Refused: m.refused, BytesIn: m.bytesIn, BytesOut: m.bytesOut}
}

// WaitingKeys is how many keys have waiters listed.
func (s *Server) WaitingKeys() int {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return len(s.st.waiting)
}
