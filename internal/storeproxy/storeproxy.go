// Package storeproxy carries a trainer's connections to the job's c10d store
// (torch's TCPStore, served by the rendezvous pod's sidecar) from the pod's
// loopback, and cuts them the moment the pod stops being a member of the job.
//
// Why a proxy at all: torch's store client, after a wait that timed out,
// sends CANCEL_WAIT and reads the answer with no timeout (TCPStore::doWait,
// torch 2.6 and 2.14). When the store's node is lost, nothing answers and
// nothing closes the connection (no FIN, no RST), so the agent blocks until
// the kernel gives the connection up (about 15 minutes), its workers stuck in
// a collective. A closed connection instead fails the agent at once
// (RendezvousConnectionError); torchrun exits and the kubelet restarts it,
// into a rendezvous on whatever store serves the job next.
//
// Why the member's lease decides: it is the job's one judgement of who is
// alive (the serving sidecar restarts the survivors when a member's lease
// ends). A pod that lost its lease, because the store is gone or because its
// own node was cut off, has been dropped from the round; its agent must not
// go on in it. And a pod whose node comes back after its replacement took its
// name never registers again, so its agent never reaches the store.
package storeproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Resolver says where the store is, at each dial: host:port, or an error.
// An error wrapping ErrRefused ends the trainer's connection at once (the
// store this pod would reach is not its job's); any other is retried until
// the connection's wait ends.
type Resolver func(ctx context.Context) (string, error)

// ErrRefused marks a Resolver's answer that no wait can change.
var ErrRefused = errors.New("refused")

// Fixed is the Resolver of an upstream that does not move (resolved by DNS at
// each dial).
func Fixed(upstream string) Resolver {
	return func(context.Context) (string, error) { return upstream, nil }
}

// Proxy forwards connections to Upstream while it is open. It starts shut.
type Proxy struct {
	upstream Resolver
	wait     time.Duration
	log      *slog.Logger
	slots    chan struct{}

	mu     sync.Mutex
	open   bool
	opened chan struct{}         // closed while open
	gen    uint64                // counts SetOpen(false)s: a connection dialled before one is not kept
	conns  map[net.Conn]struct{} // upstream connections; closing one ends its pair
}

// New returns a shut proxy to upstream (asked at each dial, and its name
// resolved then, so that a moved store is found). A new connection waits up to
// wait for the proxy to open and the store to answer a dial, then is closed
// (torch's store client gives up after its own timeout, 60 s by default). At
// most maxConns connections are carried at once; more are closed as they come.
func New(upstream Resolver, wait time.Duration, maxConns int, log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Proxy{
		upstream: upstream, wait: wait, log: log,
		slots:  make(chan struct{}, maxConns),
		opened: make(chan struct{}),
		conns:  map[net.Conn]struct{}{},
	}
}

// SetOpen opens the proxy, or shuts it: every connection it carries is
// closed at once, and new ones wait for it to open again.
func (p *Proxy) SetOpen(open bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if open == p.open {
		return
	}
	p.open = open
	if open {
		close(p.opened)
		p.log.Info("c10d store proxy open: the trainer's store connections go through")
		return
	}
	p.gen++
	p.opened = make(chan struct{})
	p.log.Warn("c10d store proxy shut: this pod is no longer a member, its trainer's store connections are closed",
		"closed", len(p.conns))
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Serve accepts connections on ln until ctx ends, then closes ln and every
// connection.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { ln.Close(); p.SetOpen(false) })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("c10d store proxy: %w", err)
		}
		select {
		case p.slots <- struct{}{}:
		default:
			p.log.Warn("c10d store proxy: too many connections; closing a new one", "max", cap(p.slots))
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-p.slots }()
			p.carry(ctx, c)
		}()
	}
}

func (p *Proxy) carry(ctx context.Context, down net.Conn) {
	defer down.Close()
	up, err := p.connect(ctx, time.Now().Add(p.wait))
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, ErrRefused) { // the resolver says why it refused, once
			p.log.Warn("c10d store proxy: closing a trainer's connection that found no store", "err", err)
		}
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src) //nolint:errcheck // either side's end ends both
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(up, down)
	go pipe(down, up)
	<-done
	<-done
	p.untrack(up)
}

var errWaited = errors.New("waited too long")

// dialAttempt bounds one dial of the store: a dial into an endpoint that
// vanished (the store's pod lost or gone, before the Service has moved) gets
// no answer at all, and the next one may reach the store that serves now.
const dialAttempt = 2 * time.Second

// connect waits for the proxy to be open, dials upstream (again every half
// second while it refuses, or after dialAttempt without an answer) and tracks
// the pair, all before deadline.
func (p *Proxy) connect(ctx context.Context, deadline time.Time) (net.Conn, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for {
		p.mu.Lock()
		open, opened, gen := p.open, p.opened, p.gen
		p.mu.Unlock()
		if !open {
			select {
			case <-opened:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("shut (not a member): %w", errWaited)
			}
		}
		addr, err := p.upstream(ctx)
		if errors.Is(err, ErrRefused) {
			return nil, err
		}
		var up net.Conn
		if err == nil {
			d := net.Dialer{Timeout: dialAttempt}
			up, err = d.DialContext(ctx, "tcp", addr)
		}
		if err == nil {
			if p.track(gen, up) {
				return up, nil
			}
			up.Close() // shut meanwhile
			continue
		}
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return nil, fmt.Errorf("the store: %w", err)
		}
	}
}

// track registers up for closing on SetOpen(false), unless the proxy was
// shut since generation gen.
func (p *Proxy) track(gen uint64, up net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.open || p.gen != gen {
		return false
	}
	p.conns[up] = struct{}{}
	return true
}

func (p *Proxy) untrack(up net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, up)
}
