// Package tcpstore is a server for torch's c10d TCPStore wire protocol, as
// torch 2.6 to 2.14 clients speak it (docs/tcpstore-protocol.md): the store
// that torchrun's c10d rendezvous and the process groups bootstrap through.
//
// The package has three parts: a pure request decoder (Decode), the store
// (keys, queues and the clients waiting on keys, under one mutex) and the
// connection loop (Server.Serve), one goroutine per connection.
//
// Where torch's two servers differ, the classic one (TCPStoreBackend.cpp,
// the only one Debian builds) is followed, except:
//   - GET and MULTI_GET of a missing key answer an empty value, as the libuv
//     server (pip builds' default) does; the classic one closes the
//     connection. Clients WAIT before they GET, so only a raw client or a
//     DELETE_KEY in between sees this.
//   - COMPARE_SET that stores a value wakes the clients waiting for the key,
//     as the libuv server does (it also wakes them when it stores nothing).
//   - QUEUE_PUSH, QUEUE_POP and QUEUE_LEN are served with the libuv server's
//     semantics (the classic server closes the connection on them).
//   - Limits (DefaultLimits: the libuv server's) refuse long keys, values and
//     key lists by closing the connection, as the libuv server does; an
//     APPEND past the value limit is refused too, and so is a request whose
//     lengths add up to more than MaxRequestLen.
//   - LIST_KEYS lists the keys sorted (torch: in hash order).
//
// Like the classic server, it closes a connection whose first request is not
// VALIDATE with Magic, that sends VALIDATE again or an unknown opcode, or
// that ADDs to (or BARRIERs on) a value that is not a number, and logs why
// at Warn with the client's address. Other connections are not affected.
package tcpstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/elastic-training/elastic-training/internal/membudget"
)

// Magic is the number a client's VALIDATE carries, its first request.
const Magic uint32 = 0x3C85F7CE

// Op is a request's first byte.
type Op uint8

// Opcodes, torch's QueryType. Torch 2.6 clients send 0x00-0x0d, 2.14
// clients 0x11 and 0x12 too; 0x0e-0x10 only come from clients of a libuv
// build (Debian's torch refuses queue operations without sending them).
const (
	OpValidate   Op = 0x00 // u32 magic; no reply
	OpSet        Op = 0x01 // key, value; no reply
	OpCompareSet Op = 0x02 // key, expected, desired; reply bytes
	OpGet        Op = 0x03 // key; reply bytes
	OpAdd        Op = 0x04 // key, i64 delta; reply i64
	OpCheck      Op = 0x05 // u64 n, n keys; reply u8 (0 ready, 1 not ready)
	OpWait       Op = 0x06 // u64 n, n keys; reply u8 0 once all exist
	OpGetNumKeys Op = 0x07 // reply i64
	OpDeleteKey  Op = 0x08 // key; reply i64 (1 or 0)
	OpAppend     Op = 0x09 // key, value; no reply
	OpMultiGet   Op = 0x0a // u64 n, n keys; reply n × bytes
	OpMultiSet   Op = 0x0b // i64 n, n × (key, value); no reply
	OpCancelWait Op = 0x0c // reply u8 1
	OpPing       Op = 0x0d // u32 nonce; reply the nonce
	OpQueuePush  Op = 0x0e // key, value; no reply
	OpQueuePop   Op = 0x0f // key; reply i64 length before the pop, then bytes if it was > 0
	OpQueueLen   Op = 0x10 // key; reply i64
	OpListKeys   Op = 0x11 // reply i64 n, n keys
	OpBarrier    Op = 0x12 // key, i64 world size; reply u8 0 once world size have arrived

	numOps = int(OpBarrier) + 1
)

var opNames = [numOps]string{
	"VALIDATE", "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "DELETE_KEY", "APPEND",
	"MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING", "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS", "BARRIER",
}

func (op Op) String() string {
	if int(op) < numOps {
		return opNames[op]
	}
	return fmt.Sprintf("0x%02x", uint8(op))
}

// Reply bytes of CHECK, WAIT, BARRIER and CANCEL_WAIT.
const (
	checkReady    = 0x00
	checkNotReady = 0x01
	stopWaiting   = 0x00
	waitCanceled  = 0x01
)

// Limits bound what one request may claim. Every length is checked against
// them before anything is allocated for it.
type Limits struct {
	MaxKeyLen   int // bytes in one key
	MaxValueLen int // bytes in one value (also the most APPEND may grow a value to)
	MaxKeys     int // keys in one CHECK, WAIT, MULTI_GET or MULTI_SET
	// MaxRequestLen bounds the sum of the keys' and values' lengths in one
	// request, so that MaxKeys × MaxValueLen is not what a MULTI_SET may hold.
	MaxRequestLen int
	// MaxReplyLen bounds one reply (MULTI_GET, LIST_KEYS), checked before
	// it is built: what one request may make the server hold for a client
	// that does not read, and the time it spends building it under the
	// store's lock.
	MaxReplyLen int
}

// DefaultLimits are torch's libuv server's (TCPStoreLibUvBackend.cpp: 8 KiB
// keys, 8 MiB values, 128 Ki keys a request), plus 64 MiB a request and
// 16 MiB a reply (two of the largest values; torch's rendezvous reads one
// key at a time). Torch's classic server has none.
func DefaultLimits() Limits {
	return Limits{MaxKeyLen: 8 << 10, MaxValueLen: 8 << 20, MaxKeys: 128 << 10, MaxRequestLen: 64 << 20, MaxReplyLen: 16 << 20}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	return Limits{MaxKeyLen: orDefault(l.MaxKeyLen, d.MaxKeyLen), MaxValueLen: orDefault(l.MaxValueLen, d.MaxValueLen),
		MaxKeys: orDefault(l.MaxKeys, d.MaxKeys), MaxRequestLen: orDefault(l.MaxRequestLen, d.MaxRequestLen),
		MaxReplyLen: orDefault(l.MaxReplyLen, d.MaxReplyLen)}
}

// ReplyTooLargeError is a request whose reply would pass Limits.MaxReplyLen.
type ReplyTooLargeError struct {
	Op       Op
	Len, Max int64
}

func (e *ReplyTooLargeError) Error() string {
	return fmt.Sprintf("%s would answer %d bytes, more than a reply may hold (%d)", e.Op, e.Len, e.Max)
}

// orDefault is v, or def when v is not positive.
func orDefault[T int | int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Quotas bound the whole server in bytes of the memory its clients can make it hold, whatever they send: a write
// that would pass Bytes, a wait that would pass WaitBytes, a request whose reply would pass ReplyBytes, and a
// connection past Connections, are refused (the client's connection closed, as for any other refused request: the
// protocol has no error reply). QuotasFor derives them from the shares of the serving sidecar's memory limit
// (internal/membudget), so that all of them full at once stay under it.
type Quotas struct {
	// Bytes bounds the store: its keys', values' and queued elements' lengths, and ItemCost for each of them.
	Bytes int64
	// WaitBytes bounds the keys that all pending WAITs and BARRIERs wait for together: each key's length and
	// WaitKeyCost, once per waiter (a key named twice in one wait counts once).
	WaitBytes int64
	// ReplyBytes bounds the reply bytes queued for every client and not yet written to its socket. A reply of
	// more than smallReply bytes that would pass it is refused before it is built; smaller ones never are, and a
	// connection holds at most replyBudget of them (ConnCost).
	ReplyBytes int64
	// Connections bounds the open client connections, each ConnCost.
	Connections int
}

// What the store holds beyond the bytes that clients sent, each a round figure above what TestCosts measures
// (go1.26, amd64), which fails when one is no longer above it.
const (
	// ItemCost is a stored key's map entry, or a queued element's slot, with the headers of its key and value
	// (measured: 78 bytes).
	ItemCost = 128
	// WaitKeyCost is one key of a pending wait: its list element, its waitRef and its share of the waiters' index
	// (measured: 180 bytes beyond the key).
	WaitKeyCost = 256
	// ConnCost is one connection (membudget.ConnCost, which the webhook sizes the serving sidecar's limit by): its
	// goroutine's stack, its read buffer and state (measured: 10 KiB, both ends), the small replies it may queue
	// (replyBudget), and the kernel's send buffer (twice sendBuffer).
	ConnCost = membudget.ConnCost
)

// ConnCost holds what it stands for: the array's length is negative, and the package does not build, otherwise.
var _ [ConnCost - (16<<10 + replyBudget + 2*sendBuffer)]struct{}

// QuotasFor derives the quotas from the memory each may hold: store for the store, waits for the waiting keys,
// replies for the queued replies, conns for the connections (ConnCost each).
func QuotasFor(store, waits, replies, conns int64) Quotas {
	return Quotas{Bytes: store, WaitBytes: waits, ReplyBytes: replies, Connections: int(max(conns/ConnCost, 1))}
}

// DefaultQuotas are those of the webhook's default memory limit of the serving sidecar, for the job's default
// backend (membudget.Split(0, 0, false)).
func DefaultQuotas() Quotas {
	b, _ := membudget.Split(0, 0, false) // the default limit always splits
	return QuotasFor(b.C10dStore, b.C10dWaits, b.C10dReplies, b.C10dConns)
}

func (q Quotas) withDefaults() Quotas {
	d := DefaultQuotas()
	return Quotas{Bytes: orDefault(q.Bytes, d.Bytes), WaitBytes: orDefault(q.WaitBytes, d.WaitBytes),
		ReplyBytes: orDefault(q.ReplyBytes, d.ReplyBytes), Connections: orDefault(q.Connections, d.Connections)}
}

// Request is one decoded request. Which fields are set depends on Op (see
// the opcode constants).
type Request struct {
	Op        Op
	Magic     uint32   // VALIDATE
	Nonce     uint32   // PING
	Key       string   // SET, COMPARE_SET, GET, ADD, DELETE_KEY, APPEND, QUEUE_*, BARRIER
	Value     []byte   // SET, APPEND, QUEUE_PUSH; COMPARE_SET's desired value
	Expected  []byte   // COMPARE_SET
	Delta     int64    // ADD
	WorldSize int64    // BARRIER
	Keys      []string // CHECK, WAIT, MULTI_GET, MULTI_SET
	Values    [][]byte // MULTI_SET, one per key
}

// UnknownOpError is a request whose first byte is no opcode.
type UnknownOpError struct{ Op Op }

func (e *UnknownOpError) Error() string { return fmt.Sprintf("unknown opcode %s", e.Op) }

// LimitError is a length or count beyond Limits.
type LimitError struct {
	Op    Op
	Field string // "key", "value", "keys" (a count) or "request" (MaxRequestLen)
	Len   uint64 // what the request claimed (for "request": the running total)
	Max   int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s: %s length %d exceeds the limit of %d", e.Op, e.Field, e.Len, e.Max)
}

// readChunk is the most Decode allocates ahead of the bytes that arrive: a
// longer string is read in pieces, its buffer growing as they come.
const readChunk = 64 << 10

// Decode reads one request from r. It returns io.EOF when r ends before the
// request's first byte, io.ErrUnexpectedEOF when it ends inside it, an
// *UnknownOpError or a *LimitError when the request is refused (nothing is
// allocated for a length beyond lim), or r's error.
func Decode(r *bufio.Reader, lim Limits) (*Request, error) {
	b, err := r.ReadByte()
	if err != nil {
		return nil, err
	}
	d := decoder{r: r, lim: lim.withDefaults(), req: &Request{Op: Op(b)}}
	d.budget = uint64(d.lim.MaxRequestLen)
	if err := d.decode(); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return d.req, nil
}

type decoder struct {
	r      *bufio.Reader
	lim    Limits
	req    *Request
	budget uint64 // what is left of MaxRequestLen
	buf    [8]byte
}

func (d *decoder) decode() (err error) {
	q := d.req
	switch q.Op {
	case OpValidate:
		q.Magic, err = d.u32()
	case OpPing:
		q.Nonce, err = d.u32()
	case OpSet, OpAppend, OpQueuePush:
		if q.Key, err = d.key(); err == nil {
			q.Value, err = d.value()
		}
	case OpCompareSet:
		if q.Key, err = d.key(); err == nil {
			if q.Expected, err = d.value(); err == nil {
				q.Value, err = d.value()
			}
		}
	case OpGet, OpDeleteKey, OpQueuePop, OpQueueLen:
		q.Key, err = d.key()
	case OpAdd, OpBarrier:
		var n uint64
		if q.Key, err = d.key(); err == nil {
			n, err = d.u64()
		}
		if q.Op == OpAdd {
			q.Delta = int64(n)
		} else {
			q.WorldSize = int64(n)
		}
	case OpCheck, OpWait, OpMultiGet, OpMultiSet:
		var n uint64
		if n, err = d.count(); err != nil {
			return err
		}
		// Grown as keys arrive, never sized by the count alone.
		q.Keys = make([]string, 0, min(n, 16))
		if q.Op == OpMultiSet {
			q.Values = make([][]byte, 0, min(n, 16))
		}
		for range n {
			k, err := d.key()
			if err != nil {
				return err
			}
			q.Keys = append(q.Keys, k)
			if q.Op == OpMultiSet {
				v, err := d.value()
				if err != nil {
					return err
				}
				q.Values = append(q.Values, v)
			}
		}
	case OpGetNumKeys, OpCancelWait, OpListKeys:
	default:
		return &UnknownOpError{Op: q.Op}
	}
	return err
}

func (d *decoder) u32() (uint32, error) {
	if _, err := io.ReadFull(d.r, d.buf[:4]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(d.buf[:4]), nil
}

func (d *decoder) u64() (uint64, error) {
	if _, err := io.ReadFull(d.r, d.buf[:8]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(d.buf[:8]), nil
}

func (d *decoder) count() (uint64, error) {
	n, err := d.u64()
	if err == nil && n > uint64(d.lim.MaxKeys) {
		return 0, &LimitError{Op: d.req.Op, Field: "keys", Len: n, Max: d.lim.MaxKeys}
	}
	return n, err
}

func (d *decoder) key() (string, error) {
	b, err := d.bytes("key", d.lim.MaxKeyLen)
	return string(b), err
}

func (d *decoder) value() ([]byte, error) { return d.bytes("value", d.lim.MaxValueLen) }

// bytes reads a u64 length and that many bytes, after checking the length
// against max and the request's budget.
func (d *decoder) bytes(field string, max int) ([]byte, error) {
	n, err := d.u64()
	if err != nil {
		return nil, err
	}
	if n > uint64(max) {
		return nil, &LimitError{Op: d.req.Op, Field: field, Len: n, Max: max}
	}
	if n > d.budget {
		return nil, &LimitError{Op: d.req.Op, Field: "request", Len: uint64(d.lim.MaxRequestLen) - d.budget + n, Max: d.lim.MaxRequestLen}
	}
	d.budget -= n
	return readN(d.r, int(n))
}

// readN reads exactly n bytes, allocating at most readChunk ahead of what
// has arrived.
func readN(r io.Reader, n int) ([]byte, error) {
	if n <= readChunk {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, err
	}
	b := make([]byte, 0, readChunk)
	for len(b) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(n-len(b), len(b)))
		}
		m, err := io.ReadFull(r, b[len(b):min(cap(b), n)])
		b = b[:len(b)+m]
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// AppendRequest appends q's wire encoding to b: what a torch client sends
// (for clients in Go: tests, benchmarks).
func AppendRequest(b []byte, q *Request) []byte {
	b = append(b, byte(q.Op))
	str := func(b []byte, s []byte) []byte {
		return append(binary.LittleEndian.AppendUint64(b, uint64(len(s))), s...)
	}
	switch q.Op {
	case OpValidate:
		b = binary.LittleEndian.AppendUint32(b, q.Magic)
	case OpPing:
		b = binary.LittleEndian.AppendUint32(b, q.Nonce)
	case OpSet, OpAppend, OpQueuePush:
		b = str(str(b, []byte(q.Key)), q.Value)
	case OpCompareSet:
		b = str(str(str(b, []byte(q.Key)), q.Expected), q.Value)
	case OpGet, OpDeleteKey, OpQueuePop, OpQueueLen:
		b = str(b, []byte(q.Key))
	case OpAdd:
		b = binary.LittleEndian.AppendUint64(str(b, []byte(q.Key)), uint64(q.Delta))
	case OpBarrier:
		b = binary.LittleEndian.AppendUint64(str(b, []byte(q.Key)), uint64(q.WorldSize))
	case OpCheck, OpWait, OpMultiGet, OpMultiSet:
		b = binary.LittleEndian.AppendUint64(b, uint64(len(q.Keys)))
		for i, k := range q.Keys {
			b = str(b, []byte(k))
			if q.Op == OpMultiSet {
				b = str(b, q.Values[i])
			}
		}
	}
	return b
}
