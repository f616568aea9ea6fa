package tcpstore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// Config configures a Server.
type Config struct {
	Log *slog.Logger // nil: discard
	// Metrics is where the server registers its metrics
	// (elastic_training_sidecar_tcpstore_*); nil: nowhere.
	Metrics prometheus.Registerer
	Limits  Limits // zero fields: DefaultLimits'
	Quotas  Quotas // zero fields: DefaultQuotas'
	// OnSet, if not nil, is called with every key and value a client SETs
	// (MULTI_SET included), after the store has it, on that client's
	// goroutine: torch's rendezvous publishes each round's MASTER_ADDR so.
	OnSet func(key string, value []byte)
	// OnCompareSet, if not nil, is called likewise with the key and the new
	// value of every COMPARE_SET that stores it: torch's dynamic rendezvous
	// keeps its state so.
	OnCompareSet func(key string, value []byte)
}

// Server is one store, served on any number of listeners.
type Server struct {
	log    *slog.Logger
	lim    Limits
	quotas Quotas
	m      *metrics
	st     *store
	// logRefusals keeps a flood of refused clients from flooding the log;
	// the refused counter counts every one.
	logRefusals *rate.Limiter
	set         func(key string, value []byte)
	cas         func(key string, value []byte)
}

// New returns a Server with an empty store. It fails only when its metrics
// cannot be registered.
func New(cfg Config) (*Server, error) {
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("tcpstore metrics: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lim, q := cfg.Limits.withDefaults(), cfg.Quotas.withDefaults()
	return &Server{log: log, lim: lim, quotas: q, m: m, st: newStore(m, lim, q), set: cfg.OnSet, cas: cfg.OnCompareSet,
		logRefusals: rate.NewLimiter(10, 20)}, nil
}

// Get returns a copy of key's value as clients stored it (with torch's "/"
// in front), for observers in the same process.
func (s *Server) Get(key string) ([]byte, bool) {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	v, ok := s.st.kv[key]
	return bytes.Clone(v), ok
}

// CompareSet stores desired under key when key holds expected, as a client's
// COMPARE_SET does, for a writer in the same process. It never creates key
// (so no WAIT is waiting for it). It reports whether it stored, and is not
// reported to OnCompareSet: the writer knows what it wrote.
func (s *Server) CompareSet(key string, expected, desired []byte) (bool, error) {
	stored, kicks, err := s.st.compareSetExisting(key, expected, bytes.Clone(desired))
	kick(kicks)
	return stored, err
}

// Set stores value under key and wakes the clients waiting for it, as a
// client's SET does, for a writer in the same process (the job's own
// rendezvous). It is not reported to OnSet.
func (s *Server) Set(key string, value []byte) error {
	s.st.mu.Lock()
	err := s.st.set(key, bytes.Clone(value))
	kicks := s.st.kicks
	s.st.kicks = nil
	s.st.mu.Unlock()
	kick(kicks)
	return err
}

// DeletePrefix deletes every key that begins with prefix, for a writer in the
// same process, and says how many. It walks every key: a writer calls it
// once per round, not per request.
func (s *Server) DeletePrefix(prefix string) int {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	n := 0
	for k := range s.st.kv {
		if strings.HasPrefix(k, prefix) && s.st.remove(k) {
			n++
		}
	}
	return n
}

// kick starts a flush for each of conns, which a wake gave a STOP_WAITING
// to write (store.kicks), off the waking goroutine: it never waits on
// another client's socket.
func kick(conns []*conn) {
	for _, c := range conns {
		go c.flushAsync()
	}
}

// readBufSize is each connection's read buffer. A connection holds it, its
// goroutine and, between replies, up to two reply buffers of at most
// keepReplyBuf bytes each.
const (
	readBufSize  = 4 << 10
	keepReplyBuf = 4 << 10
	// smallValue: longer values go out by reference rather than copied.
	smallValue = 512
	// replyBudget: a connection with more reply bytes queued than this
	// writes them before it reads another request, so a client that sends
	// requests without reading the replies costs at most this (plus one
	// reply), and waits.
	replyBudget = 16 << 10
	// sendBuffer is each connection's socket send buffer (SO_SNDBUF; the kernel
	// doubles it): what a client that does not read its replies makes the
	// kernel hold for it, charged to the container's memory, is bounded by it
	// and counted in ConnCost. A reply larger than it goes out in several writes.
	sendBuffer = 16 << 10
	// smallReply: a reply of at most this many bytes is never refused for
	// Quotas.ReplyBytes (replyBudget bounds them per connection).
	smallReply = 64
)

// writeTimeout: a client that reads nothing of a reply for this long is cut
// off. A variable for the test that shows it.
var writeTimeout = 30 * time.Second

// Serve accepts connections on l until ctx ends or l fails, serving each on
// its own goroutine. It closes l, and on return every connection it
// accepted is closed and its goroutine done. It returns nil when ctx ended,
// else l's error.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	var (
		mu    sync.Mutex
		conns = map[*conn]struct{}{}
		wg    sync.WaitGroup
	)
	defer func() {
		mu.Lock()
		for c := range conns {
			c.nc.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	var delay time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// Out of file descriptors and the like: wait and go on, as
			// net/http does.
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.log.Warn("tcpstore: accept failed; retrying", "err", err, "delay", delay)
				time.Sleep(delay)
				continue
			}
			l.Close()
			return err
		}
		delay = 0
		mu.Lock()
		full := len(conns) >= s.quotas.Connections
		mu.Unlock()
		if full {
			// Counted before the close, so that a client that sees the close
			// also sees the count (the quota test reads it right after).
			s.m.refused.WithLabelValues(refusedConnLimit).Inc()
			nc.Close()
			if s.logRefusals.Allow() {
				s.log.Warn("tcpstore: refusing client: too many connections", "remote", nc.RemoteAddr().String(),
					"reason", refusedConnLimit, "max_connections", s.quotas.Connections)
			}
			continue
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetWriteBuffer(sendBuffer) // best effort: a kernel that refuses keeps its own size
		}
		c := s.newConn(nc)
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Go(func() {
			s.serveConn(c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		})
	}
}

// conn is one client connection. Its reply bytes (parts, tail) and wait
// state are guarded by the store's mutex; wmu serializes writes to nc.
type conn struct {
	s    *Server
	nc   net.Conn
	addr string
	r    *bufio.Reader

	// Guarded by s.st.mu:
	wait     *waiter  // the pending WAIT or BARRIER
	parts    [][]byte // reply bytes to write, then tail
	tail     []byte   // small reply bytes gathered after parts
	queued   int      // bytes in parts and tail
	counted  int64    // of those, the bytes counted in store.replies (the replies to c's own requests)
	flushing bool     // a flush goroutine runs (or the connection is gone)

	wmu  sync.Mutex
	free []byte // a written tail for reuse; guarded by wmu

	pending bool // replies queued since the last flush; serveConn's own
}

func (s *Server) newConn(nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, addr: nc.RemoteAddr().String()}
	c.r = bufio.NewReaderSize(connReader{c}, readBufSize)
	return c
}

// connReader is what c.r reads from: before it reads from the network (and
// may wait there) it writes the replies queued so far. Replies to requests
// that arrived together thus go out together, and a client never waits for
// a reply that sits in our buffer.
type connReader struct{ c *conn }

func (r connReader) Read(b []byte) (int, error) {
	c := r.c
	if c.pending {
		c.pending = false
		if err := c.flush(); err != nil {
			return 0, err
		}
	}
	n, err := c.nc.Read(b)
	c.s.m.bytesIn.Add(float64(n))
	return n, err
}

// flushPending writes the queued replies of a connection about to close.
func (c *conn) flushPending() {
	if c.pending {
		c.pending = false
		c.flush()
	}
}

func (s *Server) serveConn(c *conn) {
	s.m.connections.Inc()
	s.log.Debug("tcpstore: client connected", "remote", c.addr)
	defer func() {
		s.st.drop(c)
		c.nc.Close()
		s.m.connections.Dec()
	}()
	if err := s.validate(c); err != nil {
		s.refuse(c, err)
		return
	}
	for {
		q, err := Decode(c.r, s.lim)
		if err == nil && q.Op == OpValidate {
			err = errValidateAgain // torch's server refuses it too
		}
		if err != nil {
			c.flushPending() // torch's server has answered what came before
			s.refuse(c, err)
			return
		}
		s.m.ops[q.Op].Inc()
		kicks, queued, stored, err := s.st.do(c, q)
		kick(kicks)
		c.pending = c.pending || queued > 0
		if err == nil && queued > replyBudget {
			c.pending = false
			err = c.flush()
		}
		if err != nil {
			c.flushPending()
			s.refuse(c, fmt.Errorf("%s %.100q: %w", q.Op, q.Key, err))
			return
		}
		switch {
		case s.set != nil && q.Op == OpSet:
			s.set(q.Key, q.Value)
		case s.set != nil && q.Op == OpMultiSet:
			for i, k := range q.Keys {
				s.set(k, q.Values[i])
			}
		case s.cas != nil && q.Op == OpCompareSet && stored:
			s.cas(q.Key, q.Value)
		}
	}
}

var (
	errNoValidate    = errors.New("first request is not VALIDATE")
	errValidateAgain = errors.New("VALIDATE after the first request")
)

type badMagicError struct{ magic uint32 }

func (e badMagicError) Error() string {
	return fmt.Sprintf("VALIDATE with magic 0x%08x, want 0x%08x", e.magic, Magic)
}

// validate reads the first request, which must be VALIDATE with Magic:
// torch's server closes the connection otherwise, and so do we.
func (s *Server) validate(c *conn) error {
	if b, err := c.r.Peek(1); err != nil {
		return err
	} else if Op(b[0]) != OpValidate {
		return fmt.Errorf("%w (opcode %s)", errNoValidate, Op(b[0]))
	}
	q, err := Decode(c.r, s.lim)
	if err != nil {
		return err
	}
	s.m.ops[OpValidate].Inc()
	if q.Magic != Magic {
		return badMagicError{q.Magic}
	}
	return nil
}

// refuse logs why c's connection ends: a client that went away at Debug,
// one cut off mid-request at Info, one that broke the protocol at Warn.
func (s *Server) refuse(c *conn, err error) {
	var (
		reason string
		lim    *LimitError
		op     *UnknownOpError
		magic  badMagicError
	)
	switch {
	case errors.Is(err, io.EOF):
		s.log.Debug("tcpstore: client disconnected", "remote", c.addr)
		return
	case errors.Is(err, net.ErrClosed): // by Serve, as it returns
		s.log.Debug("tcpstore: connection closed", "remote", c.addr)
		return
	case errors.Is(err, io.ErrUnexpectedEOF):
		s.log.Info("tcpstore: client disconnected in the middle of a request", "remote", c.addr)
		return
	case errors.Is(err, errNoValidate) || errors.Is(err, errValidateAgain):
		reason = refusedNoValidate
	case errors.As(err, &magic):
		reason = refusedBadMagic
	case errors.As(err, &op):
		reason = refusedUnknownOp
	case errors.As(err, &lim) || errors.Is(err, errValueLimit) || errors.As(err, new(*ReplyTooLargeError)):
		reason = refusedTooLarge
	case errors.Is(err, errNotNumber):
		reason = refusedNotNumber
	case errors.As(err, new(*StoreFullError)):
		reason = refusedStoreFull
	case errors.As(err, new(*WaitQuotaError)):
		reason = refusedWaitQuota
	case errors.As(err, new(*ReplyQuotaError)):
		reason = refusedReplyQuota
	case errors.Is(err, os.ErrDeadlineExceeded):
		reason = refusedSlowReader
	default:
		var ne net.Error
		if errors.As(err, &ne) {
			s.log.Info("tcpstore: connection failed", "remote", c.addr, "err", err)
			return
		}
		reason = "other"
	}
	s.m.refused.WithLabelValues(reason).Inc()
	if s.logRefusals.Allow() {
		s.log.Warn("tcpstore: refusing client: closing its connection", "remote", c.addr, "reason", reason, "err", err)
	}
}

// Reply bytes, queued under the store's mutex.

func (c *conn) putByte(b byte) { c.tail = append(c.tail, b); c.queued++ }

func (c *conn) putU32(v uint32) { c.tail = binary.LittleEndian.AppendUint32(c.tail, v); c.queued += 4 }

func (c *conn) putI64(v int64) {
	c.tail = binary.LittleEndian.AppendUint64(c.tail, uint64(v))
	c.queued += 8
}

func (c *conn) putString(s string) {
	c.putI64(int64(len(s)))
	c.tail = append(c.tail, s...)
	c.queued += len(s)
}

func (c *conn) putBytes(v []byte) {
	c.putI64(int64(len(v)))
	c.queued += len(v)
	if len(v) <= smallValue {
		c.tail = append(c.tail, v...)
		return
	}
	c.parts = append(c.parts, c.tail, v)
	c.tail = nil
}

// flush writes the queued reply bytes.
func (c *conn) flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.writeQueued()
	return err
}

// flushAsync writes what wakes queued for c (it runs on a goroutine of its
// own, so the waking client never waits on c's socket) until nothing is
// left, then lets the next wake start another.
func (c *conn) flushAsync() {
	for {
		c.wmu.Lock()
		n, err := c.writeQueued()
		c.wmu.Unlock()
		if err != nil {
			c.nc.Close() // its serveConn then ends and drops it
			return
		}
		if n == 0 {
			st := c.s.st
			st.mu.Lock()
			done := len(c.parts) == 0 && len(c.tail) == 0
			if done {
				c.flushing = false
			}
			st.mu.Unlock()
			if done {
				return
			}
		}
	}
}

// writeQueued takes the queued bytes and writes them; c.wmu is held.
func (c *conn) writeQueued() (int64, error) {
	st := c.s.st
	st.mu.Lock()
	parts, tail, counted := c.parts, c.tail, c.counted
	c.parts, c.tail, c.free, c.queued, c.counted = nil, c.free, nil, 0, 0
	st.mu.Unlock()
	if len(tail) > 0 {
		parts = append(parts, tail)
	}
	if len(parts) == 0 {
		c.free = tail
		return 0, nil
	}
	c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	bufs := net.Buffers(parts)
	n, err := bufs.WriteTo(c.nc)
	st.releaseReplies(counted) // written, or never to be: the bytes are the kernel's or gone
	c.s.m.bytesOut.Add(float64(n))
	if cap(tail) <= keepReplyBuf {
		c.free = tail[:0]
	}
	return n, err
}
