// Package v2api serves the etcd v2 keys HTTP API (the one python-etcd, and so
// both of torch's etcd rendezvous backends, speak) over etcd's own v2 store
// package. etcd ≥ 3.6 removed this API from the server; the store itself is
// still shipped, so this package is only the HTTP front end: parse a request,
// pick the store call, encode the result the way etcd 3.4/3.5 did.
package v2api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"go.etcd.io/etcd/server/v3/etcdserver/api/v2error"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
)

// Config configures a Server. Every field is optional.
type Config struct {
	// Store is the v2 store to serve; nil creates one with etcd's layout.
	Store v2store.Store
	// ClusterID is sent as X-Etcd-Cluster-Id (python-etcd checks it).
	ClusterID func() string
	// ClientURLs is what /v2/machines lists: python-etcd uses them as its
	// failover list, so they must be reachable by clients.
	ClientURLs func() []string
	// Raft returns the raft index and term sent as X-Raft-Index/X-Raft-Term.
	Raft func() (index, term uint64)
	// MaxDirTTL caps the TTL a directory may ask for (0: no cap). See dirttl.go.
	MaxDirTTL time.Duration
	// Metrics, when set, counts requests and active waits.
	Metrics *Metrics
	Logger  *slog.Logger
	// OnWrite, when set, is called after every successful write with the
	// node's key (as clients see it) and value; it must be quick.
	OnWrite func(key, value string)
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// WriteTimeout bounds writing one reply (each event of a long-poll wait on its own), so that a client that
	// reads nothing of it does not hold the reply in memory for as long as it stays connected (etcd's client port
	// sets no write deadline); 0: DefaultWriteTimeout.
	WriteTimeout time.Duration
	// Limits bound a value, a key, and the store with the values its history still holds (quota.go).
	Limits Limits
}

// Limits bound what the v2 store holds, and the replies it is writing; a zero field takes its default.
type Limits struct {
	MaxValueLen int   // DefaultMaxValueLen
	MaxKeyLen   int   // DefaultMaxKeyLen
	MaxBytes    int64 // DefaultMaxBytes
	// MaxReplyBytes bounds the replies built and not yet written, all clients together (a recursive GET that is
	// never read holds its whole tree for WriteTimeout): a reply past it is refused. DefaultMaxReplyBytes.
	MaxReplyBytes int64
}

// DefaultWriteTimeout is long enough for any reply to a client that reads it (python-etcd reads at once; a
// recursive GET of the largest tree torch writes is a few MiB) and short enough that unread replies are let go.
const DefaultWriteTimeout = 30 * time.Second

// Server is the v2 keys API handler.
type Server struct {
	cfg     Config
	store   v2store.Store
	dirs    *dirTTLs
	now     func() time.Time
	log     *slog.Logger
	closing chan struct{}
	once    sync.Once
	// wmu serialises the writes (and expiry passes) with the quota's account of them; reads need only the store.
	wmu   sync.Mutex
	quota *quota
	// replies is the bytes of replies built and not yet written (Limits.MaxReplyBytes).
	replies       atomic.Int64
	maxReplyBytes int64
	// logRefusals keeps the refusals' log lines to a few a second (the metric counts them all).
	logRefusals *rate.Limiter
}

// NewStore returns an empty v2 store laid out as etcd's ("/0" cluster data,
// "/1" user keys).
func NewStore() v2store.Store { return v2store.New("/0", storeKeysPrefix) }

// New returns a Server.
func New(cfg Config) *Server {
	s := &Server{cfg: cfg, store: cfg.Store, now: cfg.Now, log: cfg.Logger, closing: make(chan struct{})}
	if s.store == nil {
		s.store = NewStore()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.dirs = newDirTTLs(cfg.MaxDirTTL)
	if s.cfg.WriteTimeout <= 0 {
		s.cfg.WriteTimeout = DefaultWriteTimeout
	}
	l := s.cfg.Limits
	s.quota = newQuota(orDefault(l.MaxBytes, DefaultMaxBytes), orDefault(l.MaxValueLen, DefaultMaxValueLen), orDefault(l.MaxKeyLen, DefaultMaxKeyLen))
	s.quota.rebuild(s.store)
	s.maxReplyBytes = orDefault(l.MaxReplyBytes, DefaultMaxReplyBytes)
	s.logRefusals = rate.NewLimiter(10, 20)
	return s
}

// writeDeadline gives the reply about to be written (or the wait's next event) WriteTimeout to go out. The server
// that serves the handler may offer no deadline (then there is none to set).
func (s *Server) writeDeadline(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout)) // real time, not the TTLs' clock
}

// Store is the store behind the API (for watchers such as the round logger).
func (s *Server) Store() v2store.Store { return s.store }

// Handlers returns the paths to mount on the etcd client port
// (embed.Config.UserHandlers).
func (s *Server) Handlers() map[string]http.Handler {
	return map[string]http.Handler{
		keysPrefix:       s,
		keysPrefix + "/": s,
		"/v2/machines":   http.HandlerFunc(s.serveMachines),
	}
}

// Close ends every open long-poll wait; later waits return at once.
func (s *Server) Close() { s.once.Do(func() { close(s.closing) }) }

func (s *Server) serveMachines(w http.ResponseWriter, r *http.Request) {
	if !allowMethod(w, r.Method, http.MethodGet, http.MethodHead) {
		return
	}
	var urls []string
	if s.cfg.ClientURLs != nil {
		urls = s.cfg.ClientURLs()
	}
	w.Write([]byte(strings.Join(urls, ", ")))
}

// ServeHTTP serves /v2/keys.
func (s *Server) ServeHTTP(w http.ResponseWriter, hr *http.Request) {
	if !allowMethod(w, hr.Method, http.MethodHead, http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete) {
		s.cfg.Metrics.request("invalid", "error")
		return
	}
	if s.cfg.ClusterID != nil {
		w.Header().Set("X-Etcd-Cluster-Id", s.cfg.ClusterID())
	}
	s.writeDeadline(w)
	r, perr := parseRequest(hr)
	if perr != nil {
		s.cfg.Metrics.request("invalid", "error")
		writeError(w, perr)
		return
	}
	o := r.op()
	ev, wa, err := s.do(r, o)
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			s.cfg.Metrics.refused(ref.reason)
			if s.logRefusals.Allow() {
				s.log.Warn("v2 write refused", "remote", hr.RemoteAddr, "reason", ref.reason, "key", clip(strings.TrimPrefix(r.Path, storeKeysPrefix), 100), "err", ref.err.Cause)
			}
			err = ref.err
		}
		s.cfg.Metrics.request(string(o), outcome(err))
		writeError(w, err)
		return
	}
	if wa != nil {
		s.cfg.Metrics.request(string(o), "ok")
		s.serveWait(hr.Context(), w, wa, r.Stream)
		return
	}
	s.cfg.Metrics.request(string(o), "ok")
	s.writeEvent(w, ev, r.NoValueOnSuccess)
}

// refusedReplies is the refused counter's reason for a reply past Limits.MaxReplyBytes.
const refusedReplies = "replies_full"

// refusal is a write refused by a bound of this server (not by etcd's store): counted by reason and logged.
type refusal struct {
	reason string
	err    *v2error.Error
}

func (r *refusal) Error() string { return r.err.Error() }

// clip quotes at most n bytes of s.
func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func orDefault[T int | int64](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

func outcome(err error) string {
	var e *v2error.Error
	if errors.As(err, &e) {
		return "error_" + strconv.Itoa(e.ErrorCode)
	}
	return "error"
}

// do runs one request against the store.
func (s *Server) do(r *request, o op) (*v2store.Event, v2store.Watcher, error) {
	now := s.now()
	exp := r.expireTime(now)
	ttlOpts := v2store.TTLOptionSet{ExpireTime: exp, Refresh: r.Refresh}
	// A directory never gets its TTL from the store (see dirttl.go).
	dirTTL := r.Dir && r.TTL != nil
	if dirTTL && (o == opSet || o == opCreate || o == opCreateInOrder) {
		ttlOpts.ExpireTime = time.Time{}
	}
	var (
		ev  *v2store.Event
		err error
	)
	switch o {
	case opWatch:
		wa, err := s.store.Watch(r.Path, r.Recursive, r.Stream, r.WaitIndex)
		return nil, wa, err
	case opGet:
		ev, err = s.store.Get(r.Path, r.Recursive, r.Sorted)
		return ev, nil, err
	}
	if e := s.quota.checkRequest(r); e != nil {
		return nil, nil, &refusal{reason: "too_large", err: e}
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if o != opDelete && o != opCompareAndDelete && !r.Refresh { // a refresh keeps the value it has
		p := r.Path
		if o == opCreateInOrder {
			p += "/00000000000000000000" // the key etcd will make: as long as its own
		}
		if e := s.quota.admit(p, len(r.Value), s.store.Index()); e != nil {
			return nil, nil, &refusal{reason: "store_full", err: e}
		}
	}
	switch o {
	case opCreateInOrder:
		ev, err = s.store.Create(r.Path, r.Dir, r.Value, true, ttlOpts)
	case opCreate:
		ev, err = s.store.Create(r.Path, r.Dir, r.Value, false, ttlOpts)
	case opSet:
		ev, err = s.store.Set(r.Path, r.Dir, r.Value, ttlOpts)
	case opUpdate:
		if cur, gerr := s.store.Get(r.Path, false, false); gerr == nil && cur.Node.Dir {
			return s.updateDir(r, cur, now)
		}
		ev, err = s.store.Update(r.Path, r.Value, ttlOpts)
	case opCompareAndSwap:
		ev, err = s.store.CompareAndSwap(r.Path, r.PrevValue, r.PrevIndex, r.Value, ttlOpts)
	case opDelete:
		ev, err = s.store.Delete(r.Path, r.Dir, r.Recursive)
	case opCompareAndDelete:
		ev, err = s.store.CompareAndDelete(r.Path, r.PrevValue, r.PrevIndex)
	}
	if err != nil {
		return nil, nil, err
	}
	switch o {
	case opDelete, opCompareAndDelete:
		s.dirs.forget(ev.Node.Key)
		s.quota.deleted(ev.Node.Key, ev.EtcdIndex)
	default:
		if o == opSet || o == opCreate || o == opCreateInOrder {
			if dirTTL {
				s.dirs.set(ev.Node.Key, ttlDuration(*r.TTL), ev.Node.CreatedIndex, now)
			}
		}
		value := ""
		if ev.Node.Value != nil {
			value = *ev.Node.Value
		}
		s.quota.written(ev.Node.Key, ev.Node.Dir, value, ttlOpts.ExpireTime, r.Refresh, ev.EtcdIndex)
	}
	s.quota.release(s.store.Index())
	s.cfg.Metrics.storeBytes(s.quota.used)
	s.dirs.touch(ev.Node.Key, now)
	if s.cfg.OnWrite != nil && ev.Node.Value != nil {
		s.cfg.OnWrite(strings.TrimPrefix(ev.Node.Key, storeKeysPrefix), *ev.Node.Value)
	}
	return ev, nil, nil
}

// updateDir changes the TTL of a directory, which etcd's store refuses (see
// dirttl.go). Like etcd, a value is refused ("Not a file") and an update
// without ttl makes the directory permanent.
func (s *Server) updateDir(r *request, cur *v2store.Event, now time.Time) (*v2store.Event, v2store.Watcher, error) {
	idx := s.store.Index()
	if r.Value != "" {
		return nil, nil, v2error.NewError(v2error.EcodeNotFile, r.Path, idx)
	}
	prev := &v2store.NodeExtern{Key: cur.Node.Key, Dir: true, ModifiedIndex: cur.Node.ModifiedIndex, CreatedIndex: cur.Node.CreatedIndex}
	s.dirs.decorate(prev, now)
	if r.TTL != nil {
		s.dirs.set(r.Path, ttlDuration(*r.TTL), cur.Node.CreatedIndex, now)
	} else {
		s.dirs.forget(r.Path)
	}
	s.dirs.touch(r.Path, now)
	node := &v2store.NodeExtern{Key: cur.Node.Key, Dir: true, ModifiedIndex: cur.Node.ModifiedIndex, CreatedIndex: cur.Node.CreatedIndex}
	return &v2store.Event{Action: v2store.Update, Node: node, PrevNode: prev, EtcdIndex: idx, Refresh: r.Refresh}, nil, nil
}

// RunExpiry expires keys and directories whose TTL has passed, every
// interval, until ctx ends. etcd did the same from its leader's SYNC
// requests (every 500 ms).
func (s *Server) RunExpiry(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.ExpireNow()
		}
	}
}

// ExpireNow runs one expiry pass.
func (s *Server) ExpireNow() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	now := s.now()
	if s.store.HasTTLKeys() {
		s.store.DeleteExpiredKeys(now)
	}
	s.quota.expired(now, s.store.Index())
	s.quota.release(s.store.Index())
	defer func() { s.cfg.Metrics.storeBytes(s.quota.used) }()
	for p, created := range s.dirs.due(now) {
		cur, err := s.store.Get(p, true, false)
		if err != nil || !cur.Node.Dir || cur.Node.CreatedIndex != created {
			s.dirs.forget(p) // gone or replaced: not ours to expire
			continue
		}
		if hasLiveTTLKey(cur.Node) {
			// Keys under it are being kept alive (a live job's keep-alives):
			// the directory lives on; look again in a second.
			s.dirs.postpone(p, now.Add(time.Second))
			continue
		}
		if ev, err := s.store.Delete(p, true, true); err == nil {
			s.quota.deleted(p, ev.EtcdIndex)
			s.log.Info("v2 directory expired", "key", strings.TrimPrefix(p, storeKeysPrefix))
		}
		s.dirs.forget(p)
	}
}

func (s *Server) raftHeaders(h http.Header) {
	var idx, term uint64
	if s.cfg.Raft != nil {
		idx, term = s.cfg.Raft()
	}
	h.Set("X-Raft-Index", strconv.FormatUint(idx, 10))
	h.Set("X-Raft-Term", strconv.FormatUint(term, 10))
}

func (s *Server) writeEvent(w http.ResponseWriter, ev *v2store.Event, noValueOnSuccess bool) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Etcd-Index", strconv.FormatUint(ev.EtcdIndex, 10))
	s.raftHeaders(h)
	created := ev.IsCreated()
	ev = ev.Clone() // events may be shared with the store's history
	now := s.now()
	s.dirs.decorate(ev.Node, now)
	trimNode(ev.Node)
	trimNode(ev.PrevNode)
	if noValueOnSuccess {
		switch ev.Action {
		case v2store.Set, v2store.CompareAndSwap, v2store.Create, v2store.Update:
			ev.Node, ev.PrevNode = nil, nil
		}
	}
	// A write's reply is never refused (the write is done; its reply holds at most its own and the previous
	// value), only counted; a read's is refused before it is written.
	body, err := s.takeReply(ev, ev.Action == v2store.Get)
	if err != nil {
		s.refuseReply(w, err)
		return
	}
	defer s.releaseReply(body)
	if created {
		w.WriteHeader(http.StatusCreated)
	}
	w.Write(body)
}

// takeReply encodes ev as a reply (as json.Encoder does: a newline ends it) and counts it against
// Limits.MaxReplyBytes until releaseReply: a reply that would pass the bound is dropped at once and refused, if
// refusable.
func (s *Server) takeReply(ev *v2store.Event, refusable bool) ([]byte, error) {
	body, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	body = append(body, '\n')
	n := int64(len(body))
	if held := s.replies.Add(n); refusable && held > s.maxReplyBytes {
		s.replies.Add(-n)
		return nil, v2error.NewError(v2error.EcodeRaftInternal, fmt.Sprintf("replies full: a reply of %d bytes, with %d bytes of replies "+
			"not yet read by their clients, would pass %d (--v2-max-reply-bytes)", n, held-n, s.maxReplyBytes), 0)
	}
	return body, nil
}

func (s *Server) releaseReply(body []byte) { s.replies.Add(-int64(len(body))) }

// refuseReply answers a reply that takeReply refused: counted, logged (a few a second) and sent as etcd's error.
func (s *Server) refuseReply(w http.ResponseWriter, err error) {
	s.cfg.Metrics.refused(refusedReplies)
	if s.logRefusals.Allow() {
		s.log.Warn("v2 reply refused", "reason", refusedReplies, "err", err)
	}
	writeError(w, err)
}

// serveWait answers a wait=true GET: headers at once (long poll), then the
// first matching event (or every event with stream=true). It ends when the
// client goes away or the server closes.
func (s *Server) serveWait(ctx context.Context, w http.ResponseWriter, wa v2store.Watcher, stream bool) {
	defer wa.Remove()
	s.cfg.Metrics.waitStarted()
	defer s.cfg.Metrics.waitEnded()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Etcd-Index", strconv.FormatUint(wa.StartIndex(), 10))
	s.raftHeaders(h)
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		case ev, ok := <-wa.EventChan():
			if !ok {
				return // the store dropped a watcher that fell behind
			}
			ev = ev.Clone()
			trimNode(ev.Node)
			trimNode(ev.PrevNode)
			s.writeDeadline(w) // the wait itself may last; each event gets its own time to go out
			body, err := s.takeReply(ev, true)
			if err != nil {
				// The wait ends with no event: its client waits again from its index, and the history has it.
				s.cfg.Metrics.refused(refusedReplies)
				return
			}
			_, err = w.Write(body)
			s.releaseReply(body)
			if err != nil || !stream {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
	}
}

func trimNode(n *v2store.NodeExtern) {
	if n == nil {
		return
	}
	n.Key = strings.TrimPrefix(n.Key, storeKeysPrefix)
	for _, c := range n.Nodes {
		trimNode(c)
	}
}

func writeError(w http.ResponseWriter, err error) {
	var e *v2error.Error
	if !errors.As(err, &e) {
		e = v2error.NewError(v2error.EcodeRaftInternal, err.Error(), 0)
	}
	e.Cause = strings.TrimPrefix(e.Cause, storeKeysPrefix)
	e.WriteTo(w)
}

func allowMethod(w http.ResponseWriter, m string, ms ...string) bool {
	for _, meth := range ms {
		if m == meth {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(ms, ","))
	http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
	return false
}

// ttlDuration converts a request's ttl; ttl=0 means "expire now", as in etcd.
func ttlDuration(sec uint64) time.Duration {
	if sec == 0 {
		return time.Nanosecond
	}
	return time.Duration(sec) * time.Second
}

// hasLiveTTLKey reports whether a key with a (not yet expired) TTL exists at
// or under n.
func hasLiveTTLKey(n *v2store.NodeExtern) bool {
	if !n.Dir && n.Expiration != nil {
		return true
	}
	for _, c := range n.Nodes {
		if hasLiveTTLKey(c) {
			return true
		}
	}
	return false
}
