package tcpstore

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	rtmetrics "runtime/metrics"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// sampleRequests has one request of every opcode, as torch clients send them.
func sampleRequests() []*Request {
	return []*Request{
		{Op: OpValidate, Magic: Magic},
		{Op: OpPing, Nonce: 0x2392},
		{Op: OpSet, Key: "/k1", Value: []byte("v1")},
		{Op: OpSet, Key: "/bin", Value: []byte{0, 0xff, 0x10}},
		{Op: OpCompareSet, Key: "/cs", Expected: []byte{}, Value: []byte("new")},
		{Op: OpGet, Key: "/k1"},
		{Op: OpAdd, Key: "/cnt", Delta: -2},
		{Op: OpCheck, Keys: []string{"/k1", "/missing"}},
		{Op: OpCheck},
		{Op: OpWait, Keys: []string{"/later"}},
		{Op: OpGetNumKeys},
		{Op: OpDeleteKey, Key: "/nokey"},
		{Op: OpAppend, Key: "/ap", Value: []byte("bc")},
		{Op: OpMultiGet, Keys: []string{"/m1", "/m2"}},
		{Op: OpMultiSet, Keys: []string{"/m1", "/m2"}, Values: [][]byte{[]byte("x"), []byte("yy")}},
		{Op: OpCancelWait},
		{Op: OpQueuePush, Key: "/q", Value: []byte("a")},
		{Op: OpQueuePop, Key: "/q"},
		{Op: OpQueueLen, Key: "/q"},
		{Op: OpListKeys},
		{Op: OpBarrier, Key: "/bt", WorldSize: 2},
		{Op: OpSet, Key: "/big", Value: bytes.Repeat([]byte("Z"), 3*readChunk+17)},
	}
}

var equateEmpty = cmpopts.EquateEmpty()

func TestDecodeRoundTrip(t *testing.T) {
	var all []byte
	for _, q := range sampleRequests() {
		all = AppendRequest(all, q)
	}
	// One byte a read: the decoder must not assume a request per read.
	r := bufio.NewReaderSize(iotest.OneByteReader(bytes.NewReader(all)), 16)
	for _, want := range sampleRequests() {
		got, err := Decode(r, DefaultLimits())
		if err != nil {
			t.Fatalf("%s: %v", want.Op, err)
		}
		if d := cmp.Diff(want, got, equateEmpty); d != "" {
			t.Errorf("%s (-want +got):\n%s", want.Op, d)
		}
	}
	if _, err := Decode(r, DefaultLimits()); err != io.EOF {
		t.Fatalf("after the last request: %v, want io.EOF", err)
	}
}

func TestDecodeTranscript(t *testing.T) {
	// docs/tcpstore-protocol.md §9, T2 and T9: bytes a torch 2.14 client sent.
	t2 := "01 0300000000000000 2f6b31 0200000000000000 7631"
	t9 := "0b 0200000000000000 0300000000000000 2f6d31 0100000000000000 78 0300000000000000 2f6d32 0200000000000000 7979"
	for _, tc := range []struct {
		hex  string
		want *Request
	}{
		{t2, &Request{Op: OpSet, Key: "/k1", Value: []byte("v1")}},
		{t9, &Request{Op: OpMultiSet, Keys: []string{"/m1", "/m2"}, Values: [][]byte{[]byte("x"), []byte("yy")}}},
	} {
		got, err := Decode(bufio.NewReader(bytes.NewReader(unhex(t, tc.hex))), DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(tc.want, got, equateEmpty); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
	}
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	var b []byte
	s = strings.ReplaceAll(s, " ", "")
	for i := 0; i+1 < len(s); i += 2 {
		var v byte
		for _, c := range s[i : i+2] {
			v <<= 4
			switch {
			case c >= '0' && c <= '9':
				v |= byte(c - '0')
			case c >= 'a' && c <= 'f':
				v |= byte(c - 'a' + 10)
			default:
				t.Fatalf("bad hex %q", s)
			}
		}
		b = append(b, v)
	}
	return b
}

func TestDecodeTruncated(t *testing.T) {
	for _, q := range sampleRequests() {
		b := AppendRequest(nil, q)
		for n := 1; n < len(b); n += max(1, len(b)/50) {
			_, err := Decode(bufio.NewReader(bytes.NewReader(b[:n])), DefaultLimits())
			if err != io.ErrUnexpectedEOF {
				t.Fatalf("%s cut at %d of %d bytes: %v, want io.ErrUnexpectedEOF", q.Op, n, len(b), err)
			}
		}
	}
	if _, err := Decode(bufio.NewReader(bytes.NewReader(nil)), DefaultLimits()); err != io.EOF {
		t.Fatalf("no bytes: %v, want io.EOF", err)
	}
}

func TestDecodeUnknownOp(t *testing.T) {
	for _, b := range []byte{0x13, 0x47, 0xff} {
		_, err := Decode(bufio.NewReader(bytes.NewReader([]byte{b, 0, 0, 0})), DefaultLimits())
		var e *UnknownOpError
		if !errors.As(err, &e) || e.Op != Op(b) {
			t.Errorf("opcode 0x%02x: %v, want an UnknownOpError", b, err)
		}
	}
}

func u64le(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }

// heapAllocs is the bytes allocated so far by this process.
func heapAllocs() uint64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

func TestDecodeLimits(t *testing.T) {
	lim := Limits{MaxKeyLen: 16, MaxValueLen: 100, MaxKeys: 4, MaxRequestLen: 150}
	key := func(s string) []byte { return append(u64le(uint64(len(s))), s...) }
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, tc := range []struct {
		name  string
		in    []byte
		field string
	}{
		{"key of 2^62 bytes", cat([]byte{byte(OpGet)}, u64le(1<<62)), "key"},
		{"key of 2^64-1 bytes", cat([]byte{byte(OpSet)}, u64le(1<<64-1)), "key"},
		{"key one byte too long", cat([]byte{byte(OpGet)}, key(strings.Repeat("k", 17))), "key"},
		{"value of 2^62 bytes", cat([]byte{byte(OpSet)}, key("/k"), u64le(1<<62)), "value"},
		{"expected of 2^62 bytes", cat([]byte{byte(OpCompareSet)}, key("/k"), u64le(1<<62)), "value"},
		{"2^62 keys", cat([]byte{byte(OpWait)}, u64le(1<<62)), "keys"},
		{"5 keys", cat([]byte{byte(OpMultiGet)}, u64le(5)), "keys"},
		{"MULTI_SET count -1", cat([]byte{byte(OpMultiSet)}, u64le(1<<64-1)), "keys"},
		{"request past its budget", cat([]byte{byte(OpMultiSet)}, u64le(2),
			key("/a"), key(strings.Repeat("v", 100)), key("/b"), u64le(50)), "request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := heapAllocs()
			_, err := Decode(bufio.NewReader(bytes.NewReader(tc.in)), lim)
			allocated := heapAllocs() - before
			var e *LimitError
			if !errors.As(err, &e) || e.Field != tc.field {
				t.Fatalf("got %v, want a LimitError on %s", err, tc.field)
			}
			if allocated > 64<<10 {
				t.Errorf("allocated %d bytes to refuse a %d-byte request", allocated, len(tc.in))
			}
		})
	}
	// At the limits exactly: accepted.
	q := &Request{Op: OpMultiSet, Keys: []string{strings.Repeat("k", 16), "/b"}, Values: [][]byte{bytes.Repeat([]byte("v"), 100), {}}}
	if _, err := Decode(bufio.NewReader(bytes.NewReader(AppendRequest(nil, q))), lim); err != nil {
		t.Fatalf("a request at the limits: %v", err)
	}
}

// A claimed length is no reason to allocate: a long value is read in pieces
// as its bytes arrive.
func TestDecodeAllocatesAsBytesArrive(t *testing.T) {
	in := append(append([]byte{byte(OpSet)}, u64le(2)...), "/k"...)
	in = append(append(in, u64le(8<<20)...), make([]byte, 1000)...) // claims 8 MiB, sends 1,000 bytes
	before := heapAllocs()
	_, err := Decode(bufio.NewReader(bytes.NewReader(in)), DefaultLimits())
	allocated := heapAllocs() - before
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("got %v, want io.ErrUnexpectedEOF", err)
	}
	if allocated > 2*readChunk {
		t.Fatalf("allocated %d bytes for a value that sent 1,000 of its claimed 8 MiB", allocated)
	}
}

func FuzzDecode(f *testing.F) {
	for _, q := range sampleRequests() {
		if q.Op != OpSet || len(q.Value) < 100 {
			f.Add(AppendRequest(nil, q))
		}
	}
	f.Add(append([]byte{byte(OpSet)}, u64le(1<<62)...))
	f.Add(append(append([]byte{byte(OpMultiSet)}, u64le(3)...), u64le(1)...))
	f.Add([]byte{0x13})
	// Limits far above the bound below: a decoder that allocated what a
	// request claims, within the limits, would pass it.
	lim := Limits{MaxKeyLen: 64 << 20, MaxValueLen: 64 << 20, MaxKeys: 1 << 20, MaxRequestLen: 256 << 20}
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bytes.NewReader(data)
		r := bufio.NewReaderSize(br, 16)
		before := heapAllocs()
		q, err := Decode(r, lim)
		allocated := heapAllocs() - before
		// What a request claims does not decide what is allocated: at most a
		// piece ahead of the bytes that came, and a small multiple of them.
		// The bound is loose: the fuzzing engine allocates in this process
		// too, and the runtime counts small allocations a span at a time.
		if bound := 16*uint64(len(data)) + 4<<20; allocated > bound {
			t.Fatalf("allocated %d bytes decoding %d bytes (bound %d)", allocated, len(data), bound)
		}
		if err != nil {
			var (
				le *LimitError
				ue *UnknownOpError
			)
			if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.As(err, &le) && !errors.As(err, &ue) {
				t.Fatalf("unexpected error type %T: %v", err, err)
			}
			return
		}
		consumed := len(data) - br.Len() - r.Buffered()
		if enc := AppendRequest(nil, q); !bytes.Equal(enc, data[:consumed]) {
			t.Fatalf("re-encoded %s differs from the %d bytes it was decoded from:\n%x\n%x", q.Op, consumed, enc, data[:consumed])
		}
	})
}
