package storeproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// echoServer stands for the store: it echoes every line back.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }() //nolint:errcheck
		}
	}()
	return ln.Addr().String()
}

func start(t *testing.T, upstream string, wait time.Duration, maxConns int) (*Proxy, string) {
	t.Helper()
	return startResolver(t, Fixed(upstream), wait, maxConns)
}

func startResolver(t *testing.T, upstream Resolver, wait time.Duration, maxConns int) (*Proxy, string) {
	t.Helper()
	p := New(upstream, wait, maxConns, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return p, ln.Addr().String()
}

// roundTrip writes a line and reads what comes back; an error means the
// connection was closed.
func roundTrip(c net.Conn, r *bufio.Reader, line string) (string, error) {
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := r.ReadString('\n')
	return got, err
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func TestForwardsWhileOpenAndCutsWhenShut(t *testing.T) {
	p, addr := start(t, echoServer(t), time.Minute, 8)
	p.SetOpen(true)
	c, r := dial(t, addr)
	got, err := roundTrip(c, r, "set a 1")
	require.NoError(t, err)
	assert.Equal(t, "set a 1\n", got)

	p.SetOpen(false)
	// The trainer sees its connection end (EOF or reset), not a silence.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = roundTrip(c, r, "get a")
	require.Error(t, err)
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection must be closed, not left silent: %v", err)
}

func TestNewConnectionWaitsUntilOpen(t *testing.T) {
	p, addr := start(t, echoServer(t), time.Minute, 8)
	c, r := dial(t, addr)
	// Shut: what the trainer writes waits, and is answered once the pod is a member.
	_, err := io.WriteString(c, "ping\n")
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = r.ReadString('\n')
	require.Error(t, err, "nothing may reach the store while the proxy is shut")

	p.SetOpen(true)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	got, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "ping\n", got)
}

func TestWaitIsBounded(t *testing.T) {
	_, addr := start(t, echoServer(t), 200*time.Millisecond, 8) // never opened
	c, _ := dial(t, addr)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "a connection that found no store is closed after the wait")
}

func TestDialRetriesUntilTheStoreAnswers(t *testing.T) {
	// A port with nothing behind it yet: the store's pod is being replaced.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	upstream := ln.Addr().String()
	require.NoError(t, ln.Close())

	// The proxy asks the resolver before each dial, so a second question means the first dial was refused.
	var asked atomic.Int32
	p, addr := startResolver(t, func(ctx context.Context) (string, error) {
		asked.Add(1)
		return Fixed(upstream)(ctx)
	}, time.Minute, 8)
	p.SetOpen(true)
	c, r := dial(t, addr)
	_, err = io.WriteString(c, "hello\n")
	require.NoError(t, err)
	testenv.Eventually(t, 10*time.Second, "a dial refused and tried again", func() error {
		if n := asked.Load(); n < 2 {
			return fmt.Errorf("%d dials", n)
		}
		return nil
	})
	ln2, err := net.Listen("tcp", upstream)
	require.NoError(t, err)
	defer ln2.Close()
	go func() {
		s, err := ln2.Accept()
		if err == nil {
			defer s.Close()
			io.Copy(s, s) //nolint:errcheck
		}
	}()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	got, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "hello\n", got)
}

func TestConnectionsAreBounded(t *testing.T) {
	p, addr := start(t, echoServer(t), time.Minute, 2)
	p.SetOpen(true)
	for i := range 2 {
		c, r := dial(t, addr)
		got, err := roundTrip(c, r, "x")
		require.NoError(t, err, "connection %d", i)
		assert.Equal(t, "x\n", got)
	}
	c, _ := dial(t, addr)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "a connection past the bound is closed")
}

// A resolver's refusal (the store this pod would reach is not its job's) ends the trainer's connection at once,
// without a dial; a passing failure (the store cannot be asked yet) is retried until it answers.
func TestResolverRefusesOrRetries(t *testing.T) {
	store := echoServer(t)
	var calls atomic.Int32
	p, addr := startResolver(t, func(context.Context) (string, error) {
		switch calls.Add(1) {
		case 1:
			return "", fmt.Errorf("not a member of this job: %w", ErrRefused)
		case 2:
			return "", errors.New("the store does not answer yet")
		}
		return store, nil
	}, time.Minute, 8)
	p.SetOpen(true)

	c, r := dial(t, addr)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := roundTrip(c, r, "get a")
	require.Error(t, err, "refused: closed")
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "closed at once, not left waiting: %v", err)
	assert.Equal(t, int32(1), calls.Load())

	c, r = dial(t, addr)
	got, err := roundTrip(c, r, "set a 1")
	require.NoError(t, err, "retried after the passing failure")
	assert.Equal(t, "set a 1\n", got)
	assert.Equal(t, int32(3), calls.Load())
}
