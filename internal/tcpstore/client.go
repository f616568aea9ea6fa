package tcpstore

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// Client is one raw TCPStore connection, speaking torch's protocol with this
// package's encoder: the sidecar's own writes to the job's store (a pod's
// progress), and tests and benchmarks that send what no torch client would.
type Client struct {
	nc  net.Conn
	r   *bufio.Reader
	buf []byte
}

// Dial connects to addr and sends VALIDATE (which has no reply) and a
// PING, whose reply shows that the server has taken the connection.
func Dial(addr string) (*Client, error) {
	nc, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		return nil, err
	}
	c := &Client{nc: nc, r: bufio.NewReaderSize(nc, 512)}
	nc.SetDeadline(time.Now().Add(60 * time.Second))
	err = c.Send(&Request{Op: OpValidate, Magic: Magic})
	if err == nil {
		err = c.Send(&Request{Op: OpPing, Nonce: 0x5eed})
	}
	if err == nil {
		err = c.Reply(OpPing)
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return c, nil
}

func (c *Client) Send(q *Request) error {
	c.buf = AppendRequest(c.buf[:0], q)
	_, err := c.nc.Write(c.buf)
	return err
}

// Reply reads and checks the reply to a request of op.
func (c *Client) Reply(op Op) error {
	var b [8]byte
	switch op {
	case OpGet, OpCompareSet:
		n, err := c.valueLen()
		if err == nil {
			_, err = c.r.Discard(int(n))
		}
		return err
	case OpAdd, OpDeleteKey: // i64: the new value, whether the key was there
		_, err := io.ReadFull(c.r, b[:8])
		return err
	case OpWait: // u8 STOP_WAITING (0)
		if _, err := io.ReadFull(c.r, b[:1]); err != nil {
			return err
		}
		if b[0] != 0 {
			return fmt.Errorf("WAIT answered %d", b[0])
		}
	case OpCancelWait: // u8 WAIT_CANCELED, after a STOP_WAITING that was on its way
		if _, err := io.ReadFull(c.r, b[:1]); err != nil {
			return err
		}
		if b[0] == 0 { // STOP_WAITING first
			if _, err := io.ReadFull(c.r, b[:1]); err != nil {
				return err
			}
		}
	case OpPing: // the nonce
		if _, err := io.ReadFull(c.r, b[:4]); err != nil {
			return err
		}
		if n := binary.LittleEndian.Uint32(b[:4]); n != 0x5eed {
			return fmt.Errorf("PING answered 0x%x", n)
		}
	}
	return nil
}

// Value reads the reply to a GET or COMPARE_SET: the value.
func (c *Client) Value() ([]byte, error) {
	n, err := c.valueLen()
	if err != nil {
		return nil, err
	}
	v := make([]byte, n)
	_, err = io.ReadFull(c.r, v)
	return v, err
}

// valueLen reads the u64 length that a GET's or COMPARE_SET's value follows.
func (c *Client) valueLen() (uint64, error) {
	var b [8]byte
	_, err := io.ReadFull(c.r, b[:])
	return binary.LittleEndian.Uint64(b[:]), err
}

// Do sends q and reads its reply.
func (c *Client) Do(q *Request) error {
	if err := c.Send(q); err != nil {
		return err
	}
	return c.Reply(q.Op)
}

// Conn is the connection, to send raw bytes or set deadlines.
func (c *Client) Conn() net.Conn { return c.nc }

// Close closes the connection.
func (c *Client) Close() error { return c.nc.Close() }
