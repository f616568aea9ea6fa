package tcpstore

import (
	"container/list"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// store is the state every connection shares: the keys, the queues and the
// clients waiting for keys, under one mutex. Replies are queued on the
// connection (conn.put*) under the same mutex, so that a STOP_WAITING that
// another client's SET causes goes out in the order torch's single-threaded
// server would send it: before any reply to a request that came after it.
//
// Values are never modified once stored (APPEND may extend one in place,
// past the end other slices of it see), so replies hold them by reference.
type store struct {
	mu      sync.Mutex
	kv      map[string][]byte
	queues  map[string][][]byte
	waiting map[string]*list.List // key -> the waitRefs of the clients waiting for it, in arrival order
	// waitingPeak is len(waiting) at its largest since it was last made anew: a Go map keeps its buckets when
	// its entries go, so an index that a flood of waits grew is replaced once it has shrunk (shrinkWaiting).
	waitingPeak int
	waitKeys    int   // keys listed in waiting
	waitBytes   int64 // their cost, against Quotas.WaitBytes
	// replies is the reply bytes queued for every connection or being written to its socket, against
	// Quotas.ReplyBytes.
	replies int64
	m       *metrics
	lim     Limits
	quotas  Quotas
	items   int   // keys and queued elements
	bytes   int64 // their keys' and values' lengths, and ItemCost each: against Quotas.Bytes
	// keyBytes is the length of kv's keys together: LIST_KEYS's reply, known before it is built.
	keyBytes int64

	// kicks are connections that a wake gave a STOP_WAITING to write and
	// that have no flush running: the caller starts one after unlocking.
	kicks []*conn
	// casStored says the COMPARE_SET being applied stored its value.
	casStored bool
}

// waiter is one client's pending WAIT or BARRIER: it is listed under each of
// keys (each once: a key named twice counts once), and answered when left
// reaches 0. elems[i] is its entry in waiting[keys[i]], nil once that key has
// come (or the wait ended), so that ending the wait costs O(len(keys)), not a
// walk of every key's waiters.
type waiter struct {
	c     *conn
	keys  []string
	elems []*list.Element
	left  int
}

// waitRef is a waiter's entry under one of its keys: keys[i].
type waitRef struct {
	w *waiter
	i int
}

// WaitQuotaError is a WAIT or BARRIER whose keys would pass Quotas.WaitBytes.
type WaitQuotaError struct {
	Keys    int   // the wait's keys
	Bytes   int64 // their cost
	Waiting int64 // the cost of the keys waited for already
	Quota   int64
}

func (e *WaitQuotaError) Error() string {
	return fmt.Sprintf("the store's waits are full: %d more keys to wait for (%d bytes), %d bytes waited for already (quota %d)",
		e.Keys, e.Bytes, e.Waiting, e.Quota)
}

// ReplyQuotaError is a request whose reply would pass Quotas.ReplyBytes: the replies of other clients that have
// not read theirs fill it.
type ReplyQuotaError struct {
	Op     Op
	Len    int64 // the reply's
	Queued int64 // every client's replies not yet written
	Quota  int64
}

func (e *ReplyQuotaError) Error() string {
	return fmt.Sprintf("%s: a reply of %d bytes, with %d bytes of replies not yet written to their clients, would pass the quota of %d",
		e.Op, e.Len, e.Queued, e.Quota)
}

var (
	errNotNumber  = errors.New("the value is not a decimal integer")
	errValueLimit = errors.New("APPEND would make the value longer than the limit")
)

// StoreFullError is a write the store's quota does not leave room for.
type StoreFullError struct {
	Items    int   // keys and queued elements, with the write
	Bytes    int64 // their cost, with the write
	Quota    int64
	Reserved bool // the last eighth of the quota is the rendezvous', and the write's keys are not
}

func (e *StoreFullError) Error() string {
	reserve := ""
	if e.Reserved {
		reserve = " (the last eighth is kept for torch's rendezvous keys, " + rendezvousPrefix + "*)"
	}
	return fmt.Sprintf("the store is full: the write would make %d keys and queued elements of %d bytes with their cost (quota %d)%s",
		e.Items, e.Bytes, e.Quota, reserve)
}

func newStore(m *metrics, lim Limits, q Quotas) *store {
	return &store{kv: map[string][]byte{}, queues: map[string][][]byte{}, waiting: map[string]*list.List{}, m: m, lim: lim, quotas: q}
}

// rendezvousPrefix begins every key torch's c10d rendezvous writes (its state,
// and each round's store; torch's client puts the "/" in front). The last
// eighth of the store's quotas is theirs alone: a client that fills the store
// with keys of its own leaves room for the rendezvous to go on. (A client
// that writes under torch's own prefix competes with torch: who may reach the
// store at all is the NetworkPolicy's and the verifying sidecars' to decide.)
const rendezvousPrefix = "/torch.rendezvous."

// BackendKeyPrefix begins every key of the elastic-training backend
// (internal/rdzv/c10drounds): they share the reserve with torch's.
const BackendKeyPrefix = "/elastic-training/"

// isRendezvousKey says whether key may use the reserve.
func isRendezvousKey(key string) bool {
	return strings.HasPrefix(key, rendezvousPrefix) || strings.HasPrefix(key, BackendKeyPrefix)
}

// reserve accounts for a write that adds items and bytes (either may be
// negative; each item costs ItemCost more), or refuses it when it would pass
// the quota: all of it for the rendezvous' keys (rdzv), seven eighths for any
// other. Writes that shrink the store always pass.
func (s *store) reserve(items int, bytes int64, rdzv bool) error {
	bytes += int64(items) * ItemCost
	ni, nb := s.items+items, s.bytes+bytes
	max := s.quotas.Bytes
	if !rdzv {
		max -= max / 8
	}
	if bytes > 0 && nb > max {
		return &StoreFullError{Items: ni, Bytes: nb, Quota: s.quotas.Bytes, Reserved: !rdzv}
	}
	s.items, s.bytes = ni, nb
	s.m.storeBytes.Set(float64(s.bytes))
	return nil
}

// costOf is cost, and whether key may use the reserve: reserve's arguments.
func (s *store) costOf(key string, value []byte) (int, int64, bool) {
	items, bytes := s.cost(key, value)
	return items, bytes, isRendezvousKey(key)
}

// cost is what storing value under key adds to the store.
func (s *store) cost(key string, value []byte) (int, int64) {
	if cur, ok := s.kv[key]; ok {
		return 0, int64(len(value) - len(cur))
	}
	return 1, int64(len(key) + len(value))
}

// do serves q for c: it changes the store, queues c's reply and wakes
// waiters. It returns the connections to kick (see kicks), how many reply
// bytes c has queued, whether a COMPARE_SET stored its value, and an error
// that means c is to be closed, as torch's server closes it.
func (s *store) do(c *conn, q *Request) (kicks []*conn, queued int, stored bool, err error) {
	if q.Op == OpWait && len(q.Keys) > 1 {
		q.Keys = uniq(q.Keys) // before the lock: what every other client waits for is the lock's time
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	before := c.queued
	err = s.apply(c, q)
	if n := int64(c.queued - before); n > 0 {
		s.replies += n
		c.counted += n
	}
	kicks, s.kicks = s.kicks, nil
	stored, s.casStored = s.casStored, false
	return kicks, c.queued, stored, err
}

// apply serves q, one handler per operation, as torch's servers do.
func (s *store) apply(c *conn, q *Request) error {
	switch q.Op {
	case OpPing:
		return s.handlePing(c, q)
	case OpSet:
		return s.handleSet(c, q)
	case OpMultiSet:
		return s.handleMultiSet(c, q)
	case OpCompareSet:
		return s.handleCompareSet(c, q)
	case OpGet:
		return s.handleGet(c, q)
	case OpMultiGet:
		return s.handleMultiGet(c, q)
	case OpAdd:
		return s.handleAdd(c, q)
	case OpAppend:
		return s.handleAppend(c, q)
	case OpCheck:
		return s.handleCheck(c, q)
	case OpWait:
		return s.handleWait(c, q)
	case OpCancelWait:
		return s.handleCancelWait(c, q)
	case OpGetNumKeys:
		return s.handleGetNumKeys(c, q)
	case OpDeleteKey:
		return s.handleDeleteKey(c, q)
	case OpListKeys:
		return s.handleListKeys(c, q)
	case OpQueuePush:
		return s.handleQueuePush(c, q)
	case OpQueuePop:
		return s.handleQueuePop(c, q)
	case OpQueueLen:
		return s.handleQueueLen(c, q)
	case OpBarrier:
		return s.handleBarrier(c, q)
	}
	return nil // VALIDATE: serveConn takes the first, and refuses any other
}

// The handlers below share one signature, so that apply reads as a table;
// those that cannot fail return nil.

func (s *store) handlePing(c *conn, q *Request) error {
	c.putU32(q.Nonce)
	return nil
}

func (s *store) handleSet(_ *conn, q *Request) error {
	return s.set(q.Key, q.Value)
}

func (s *store) handleMultiSet(_ *conn, q *Request) error {
	// All or nothing: the quotas are checked for the whole request.
	if err := s.reserve(s.multiSetCost(q.Keys, q.Values)); err != nil {
		return err
	}
	for i, k := range q.Keys {
		s.put(k, q.Values[i])
	}
	return nil
}

// multiSetCost is what storing values under keys, in order, adds to the
// store (a key named twice is stored twice, the last value kept), and
// whether every key may use the reserve: reserve's arguments.
func (s *store) multiSetCost(keys []string, values [][]byte) (items int, bytes int64, rdzv bool) {
	lens := map[string]int{}
	for i, k := range keys {
		n, ok := lens[k]
		if !ok {
			var cur []byte
			cur, ok = s.kv[k]
			n = len(cur)
		}
		if ok {
			bytes += int64(len(values[i]) - n)
		} else {
			items, bytes = items+1, bytes+int64(len(k)+len(values[i]))
		}
		lens[k] = len(values[i])
	}
	rdzv = true
	for _, k := range keys {
		rdzv = rdzv && isRendezvousKey(k)
	}
	return items, bytes, rdzv
}

func (s *store) handleCompareSet(c *conn, q *Request) error {
	// The reply is one of the three values; checked before anything is stored.
	if err := s.replyFits(q.Op, 8+int64(max(len(s.kv[q.Key]), len(q.Expected), len(q.Value)))); err != nil {
		return err
	}
	reply, stored, err := s.compareSet(q.Key, q.Expected, q.Value, true)
	if err != nil {
		return err
	}
	s.casStored = stored
	c.putBytes(reply)
	return nil
}

func (s *store) handleGet(c *conn, q *Request) error {
	// A missing key (clients WAIT first, so only a raw client or a
	// DELETE_KEY in between gets here) is answered with an empty value,
	// as torch's libuv server does; its classic server closes the
	// connection.
	v := s.kv[q.Key]
	if err := s.replyFits(q.Op, 8+int64(len(v))); err != nil {
		return err
	}
	c.putBytes(v)
	return nil
}

func (s *store) handleMultiGet(c *conn, q *Request) error {
	n := int64(0)
	for _, k := range q.Keys {
		n += 8 + int64(len(s.kv[k]))
	}
	if err := s.replyFits(q.Op, n); err != nil {
		return err
	}
	for _, k := range q.Keys {
		c.putBytes(s.kv[k])
	}
	return nil
}

func (s *store) handleAdd(c *conn, q *Request) error {
	n, err := s.counter(q.Key, q.Delta)
	if err != nil {
		return err
	}
	if err := s.set(q.Key, strconv.AppendInt(nil, n, 10)); err != nil {
		return err
	}
	c.putI64(n)
	return nil
}

// counter is key's value read as a counter (parseInt) plus delta: delta
// for a missing key.
func (s *store) counter(key string, delta int64) (int64, error) {
	cur, ok := s.kv[key]
	if !ok {
		return delta, nil
	}
	v, err := parseInt(cur)
	if err != nil {
		return 0, err
	}
	return v + delta, nil
}

func (s *store) handleAppend(_ *conn, q *Request) error {
	cur := s.kv[q.Key]
	if len(cur)+len(q.Value) > s.lim.MaxValueLen {
		return errValueLimit
	}
	return s.set(q.Key, append(cur, q.Value...))
}

func (s *store) handleCheck(c *conn, q *Request) error {
	if s.present(q.Keys) {
		c.putByte(checkReady)
	} else {
		c.putByte(checkNotReady)
	}
	return nil
}

func (s *store) handleWait(c *conn, q *Request) error {
	if !s.present(q.Keys) {
		return s.wait(c, q.Keys)
	}
	c.putByte(stopWaiting)
	return nil
}

func (s *store) handleCancelWait(c *conn, _ *Request) error {
	// Always answered, pending wait or not: the client reads this byte
	// after any STOP_WAITING that was already on its way.
	s.cancel(c)
	c.putByte(waitCanceled)
	return nil
}

func (s *store) handleGetNumKeys(c *conn, _ *Request) error {
	c.putI64(int64(len(s.kv)))
	return nil
}

func (s *store) handleDeleteKey(c *conn, q *Request) error {
	c.putI64(b2i(s.remove(q.Key)))
	return nil
}

// remove deletes key, if there, and gives its room back.
func (s *store) remove(key string) bool {
	cur, ok := s.kv[key]
	if ok {
		s.reserve(-1, -int64(len(key)+len(cur)), true)
		s.keyBytes -= int64(len(key))
		delete(s.kv, key)
		s.m.keys.Set(float64(len(s.kv)))
	}
	return ok
}

func (s *store) handleListKeys(c *conn, q *Request) error {
	if err := s.replyFits(q.Op, 8+8*int64(len(s.kv))+s.keyBytes); err != nil {
		return err
	}
	keys := make([]string, 0, len(s.kv))
	for k := range s.kv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	c.putI64(int64(len(keys)))
	for _, k := range keys {
		c.putString(k)
	}
	return nil
}

func (s *store) handleQueuePush(_ *conn, q *Request) error {
	if err := s.reserve(1, int64(len(q.Key)+len(q.Value)), isRendezvousKey(q.Key)); err != nil {
		return err
	}
	s.queues[q.Key] = append(s.queues[q.Key], q.Value)
	s.wakeOne(q.Key)
	return nil
}

func (s *store) handleQueuePop(c *conn, q *Request) error {
	qu := s.queues[q.Key]
	if len(qu) > 0 {
		if err := s.replyFits(q.Op, 16+int64(len(qu[0]))); err != nil {
			return err
		}
	}
	c.putI64(int64(len(qu)))
	if len(qu) == 0 {
		return nil
	}
	c.putBytes(qu[0])
	s.reserve(-1, -int64(len(q.Key)+len(qu[0])), true)
	qu[0] = nil
	if qu = qu[1:]; len(qu) == 0 {
		delete(s.queues, q.Key)
	} else {
		s.queues[q.Key] = qu
	}
	return nil
}

func (s *store) handleQueueLen(c *conn, q *Request) error {
	c.putI64(int64(len(s.queues[q.Key])))
	return nil
}

func (s *store) handleBarrier(c *conn, q *Request) error {
	n, err := s.counter(q.Key, 1)
	if err != nil {
		return err
	}
	// The counter is an ordinary key, and never reset. Torch's servers
	// store it without waking anyone until the last one arrives.
	v := strconv.AppendInt(nil, n, 10)
	if err := s.reserve(s.costOf(q.Key, v)); err != nil {
		return err
	}
	s.write(q.Key, v)
	if n < q.WorldSize {
		return s.register(c, []string{q.Key})
	}
	s.wakeAll(q.Key)
	c.putByte(stopWaiting)
	return nil
}

// compareSet is COMPARE_SET, as torch's servers do it: desired replaces
// key's value when that value is expected, and a missing key is created
// when expected is empty, if create allows. It returns what a client is
// answered, desired when stored, and whether it stored.
func (s *store) compareSet(key string, expected, desired []byte, create bool) (reply []byte, stored bool, err error) {
	cur, ok := s.kv[key]
	switch {
	case !ok && (len(expected) > 0 || !create):
		// Torch answers the expected value for a missing key (its
		// source calls this "lying to the caller") and stores nothing.
		return expected, false, nil
	case ok && string(cur) != string(expected):
		return cur, false, nil
	}
	if err := s.set(key, desired); err != nil {
		return nil, false, err
	}
	return desired, true, nil
}

// compareSetExisting is compareSet for a writer in the same process, which
// never creates key. It returns whether it stored, and the connections to
// kick (see kicks).
func (s *store) compareSetExisting(key string, expected, desired []byte) (stored bool, kicks []*conn, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, stored, err = s.compareSet(key, expected, desired, false)
	kicks, s.kicks = s.kicks, nil
	return stored, kicks, err
}

// set stores value under key and wakes everyone waiting for it, unless the
// quotas leave no room for it.
func (s *store) set(key string, value []byte) error {
	if err := s.reserve(s.costOf(key, value)); err != nil {
		return err
	}
	s.put(key, value)
	return nil
}

// put stores value under key, accounted for already, and wakes everyone
// waiting for it.
func (s *store) put(key string, value []byte) {
	s.write(key, value)
	s.wakeAll(key)
}

// write stores value under key, accounted for already, waking no one.
func (s *store) write(key string, value []byte) {
	if _, ok := s.kv[key]; !ok {
		s.keyBytes += int64(len(key))
	}
	s.kv[key] = value
	s.m.keys.Set(float64(len(s.kv)))
}

// replyFits refuses a reply of n bytes that would pass Limits.MaxReplyLen, or Quotas.ReplyBytes with the replies
// not yet written, before anything of it is built.
func (s *store) replyFits(op Op, n int64) error {
	if n > int64(s.lim.MaxReplyLen) {
		return &ReplyTooLargeError{Op: op, Len: n, Max: int64(s.lim.MaxReplyLen)}
	}
	if n > smallReply && s.replies+n > s.quotas.ReplyBytes {
		return &ReplyQuotaError{Op: op, Len: n, Queued: s.replies, Quota: s.quotas.ReplyBytes}
	}
	return nil
}

// present reports whether every key exists: as a key, or as a queue that is
// not empty (torch's libuv server counts those too).
func (s *store) present(keys []string) bool {
	for _, k := range keys {
		if !s.has(k) {
			return false
		}
	}
	return true
}

func (s *store) has(k string) bool {
	_, ok := s.kv[k]
	return ok || len(s.queues[k]) > 0
}

// wait registers c as waiting for the keys that are missing, each once.
// (keys holds no key twice: do removed the repeats.)
func (s *store) wait(c *conn, keys []string) error {
	var missing []string
	for _, k := range keys {
		if !s.has(k) {
			missing = append(missing, k)
		}
	}
	return s.register(c, missing)
}

// uniq is keys without repeats, in the order they first come.
func uniq(keys []string) []string {
	seen := make(map[string]struct{}, len(keys))
	out := keys[:0:0]
	for _, k := range keys {
		if _, dup := seen[k]; !dup {
			seen[k] = struct{}{}
			out = append(out, k)
		}
	}
	return out
}

// register makes keys (no key twice) c's one pending wait. Torch clients
// never have two (a store lock is held from WAIT until its answer); a second
// replaces the first, which then gets no answer.
func (s *store) register(c *conn, keys []string) error {
	s.cancel(c)
	cost := int64(0)
	for _, k := range keys {
		cost += waitCost(k)
	}
	if s.waitBytes+cost > s.quotas.WaitBytes {
		return &WaitQuotaError{Keys: len(keys), Bytes: cost, Waiting: s.waitBytes, Quota: s.quotas.WaitBytes}
	}
	w := &waiter{c: c, keys: keys, elems: make([]*list.Element, len(keys)), left: len(keys)}
	for i, k := range keys {
		l := s.waiting[k]
		if l == nil {
			l = list.New()
			s.waiting[k] = l
		}
		w.elems[i] = l.PushBack(waitRef{w, i})
	}
	s.waitingPeak = max(s.waitingPeak, len(s.waiting))
	s.waitKeys += len(keys)
	s.waitBytes += cost
	c.wait = w
	s.m.waiters.Inc()
	s.m.waitingKeys.Set(float64(s.waitKeys))
	return nil
}

// cancel drops c's pending wait, if any, without answering it: O(its keys).
func (s *store) cancel(c *conn) {
	w := c.wait
	if w == nil {
		return
	}
	for i, e := range w.elems {
		if e == nil {
			continue
		}
		k := w.keys[i]
		l := s.waiting[k]
		l.Remove(e)
		w.elems[i] = nil
		s.waitKeys--
		s.waitBytes -= waitCost(k)
		if l.Len() == 0 {
			delete(s.waiting, k)
		}
	}
	c.wait = nil
	s.m.waiters.Dec()
	s.m.waitingKeys.Set(float64(s.waitKeys))
	s.shrinkWaiting()
}

// shrinkWaiting makes the index anew once a flood of waits that grew it has
// mostly gone: a Go map never gives its buckets back (16 clients waiting for
// 128 Ki keys each left about 200 MiB behind). Amortized O(1): the copy costs
// the entries left, at most a quarter of those that went.
func (s *store) shrinkWaiting() {
	if s.waitingPeak < 1024 || len(s.waiting) > s.waitingPeak/4 {
		return
	}
	fresh := make(map[string]*list.List, len(s.waiting))
	for k, l := range s.waiting {
		fresh[k] = l
	}
	s.waiting, s.waitingPeak = fresh, len(fresh)
}

// arrived takes r off its key's list: that key came for r's waiter.
func (s *store) arrived(r waitRef) {
	r.w.elems[r.i] = nil
	s.waitKeys--
	s.waitBytes -= waitCost(r.w.keys[r.i])
}

// waitCost is what waiting for key costs one waiter.
func waitCost(key string) int64 { return int64(len(key)) + WaitKeyCost }

// wakeAll counts key as arrived for everyone waiting for it.
func (s *store) wakeAll(key string) {
	l, ok := s.waiting[key]
	if !ok {
		return
	}
	delete(s.waiting, key)
	for e := l.Front(); e != nil; e = e.Next() {
		r := e.Value.(waitRef)
		s.arrived(r)
		if r.w.left--; r.w.left == 0 {
			s.answer(r.w)
		}
	}
	s.m.waitingKeys.Set(float64(s.waitKeys))
	s.shrinkWaiting()
}

// wakeOne counts key as arrived for its waiters in order until one of them
// has all its keys (QUEUE_PUSH: one element, one client woken, as torch's
// libuv server does).
func (s *store) wakeOne(key string) {
	l := s.waiting[key]
	if l == nil {
		return
	}
	for e := l.Front(); e != nil; e = l.Front() {
		r := l.Remove(e).(waitRef)
		s.arrived(r)
		if r.w.left--; r.w.left == 0 {
			s.answer(r.w)
			break
		}
	}
	if l.Len() == 0 {
		delete(s.waiting, key)
	}
	s.m.waitingKeys.Set(float64(s.waitKeys))
	s.shrinkWaiting()
}

// answer sends w's client STOP_WAITING: every registration of w is gone.
func (s *store) answer(w *waiter) {
	c := w.c
	c.wait = nil
	s.m.waiters.Dec()
	c.putByte(stopWaiting)
	if !c.flushing {
		c.flushing = true
		s.kicks = append(s.kicks, c)
	}
}

// drop forgets c: its pending wait goes, and no flush starts for it again.
func (s *store) drop(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancel(c)
	c.flushing = true
	s.replies -= c.counted
	c.parts, c.tail, c.queued, c.counted = nil, nil, 0, 0
}

// releaseReplies gives back n bytes of replies that are written (or never will be).
func (s *store) releaseReplies(n int64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	s.replies -= n
	s.mu.Unlock()
}

// parseInt reads a stored counter as torch does (std::stoll): leading
// white space, an optional sign, at least one decimal digit, and nothing
// that follows counts; an empty, non-numeric or out-of-range value is an
// error.
func parseInt(b []byte) (int64, error) {
	i := 0
	for i < len(b) && (b[i] == ' ' || (b[i] >= '\t' && b[i] <= '\r')) {
		i++
	}
	neg := false
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		neg = b[i] == '-'
		i++
	}
	start := i
	var u uint64
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		d := uint64(b[i] - '0')
		if u > (1<<63-d)/10 { // u*10+d would pass 1<<63, beyond every int64
			return 0, errNotNumber
		}
		u = u*10 + d
	}
	switch {
	case i == start:
		return 0, errNotNumber
	case neg:
		return -int64(u), nil // -(1<<63) wraps to itself: math.MinInt64
	case u > 1<<63-1:
		return 0, errNotNumber
	}
	return int64(u), nil
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
