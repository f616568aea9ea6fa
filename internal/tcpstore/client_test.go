package tcpstore_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	. "github.com/elastic-training/elastic-training/internal/tcpstore" // as server_test.go
)

// client speaks the protocol byte by byte, as torch's client does.
type client struct {
	t  testing.TB
	nc net.Conn
	r  *bufio.Reader
}

// dialRaw connects without VALIDATE.
func dialRaw(t testing.TB, addr string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &client{t: t, nc: nc, r: bufio.NewReader(nc)}
}

// dial connects, then sends VALIDATE and PING as torch's client does.
func dial(t testing.TB, addr string) *client {
	t.Helper()
	c := dialRaw(t, addr)
	c.send(&Request{Op: OpValidate, Magic: Magic}, &Request{Op: OpPing, Nonce: 4242})
	if got := c.u32(); got != 4242 {
		t.Fatalf("PING answered %d, want 4242", got)
	}
	return c
}

// send writes the requests in one write.
func (c *client) send(qs ...*Request) {
	c.t.Helper()
	var b []byte
	for _, q := range qs {
		b = AppendRequest(b, q)
	}
	c.sendRaw(b)
}

func (c *client) sendRaw(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *client) read(n int) []byte {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c.r, b); err != nil {
		c.t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

func (c *client) byte1() byte   { c.t.Helper(); return c.read(1)[0] }
func (c *client) u32() uint32   { c.t.Helper(); return binary.LittleEndian.Uint32(c.read(4)) }
func (c *client) i64() int64    { c.t.Helper(); return int64(binary.LittleEndian.Uint64(c.read(8))) }
func (c *client) bytes() []byte { c.t.Helper(); return c.read(int(c.i64())) }

// sync sends a PING and reads its answer: everything before it was served.
func (c *client) sync() {
	c.t.Helper()
	c.send(&Request{Op: OpPing, Nonce: 77})
	if got := c.u32(); got != 77 {
		c.t.Fatalf("PING answered %d, want 77 (a stray reply before it?)", got)
	}
}

// expectClosed reads until the server closes the connection; no byte may come.
func (c *client) expectClosed() {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := c.r.ReadByte()
	if err == nil {
		c.t.Fatalf("read 0x%02x, want the connection closed", b)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatalf("connection still open after 10s")
	}
}

func (c *client) get(key string) []byte {
	c.t.Helper()
	c.send(&Request{Op: OpGet, Key: key})
	return c.bytes()
}

func (c *client) set(key, value string) {
	c.t.Helper()
	c.send(&Request{Op: OpSet, Key: key, Value: []byte(value)})
}

// u64le is n as the protocol sends lengths and counts.
func u64le(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }
