// Package servinglease decides which pod serves a job's rendezvous and points
// the job's rendezvous Service at it.
//
// Why: the rendezvous (torch's c10d store and the membership's etcd) lives in
// one pod's sidecar, by default worker 0's. When that pod's node is lost,
// Kubernetes replaces the pod only after the node's grace period and the pod's
// toleration (about a minute), and every agent waits for it. Instead a few
// pods are candidates: the one that holds the Kubernetes Lease <job>-rdzv
// serves, and writes its address into the EndpointSlice <job>-rdzv of the
// selector-less Service <job>-rdzv, through which every pod reaches the
// rendezvous. The others stand by, registered with it as members.
//
// Never two rendezvous at once, and never a restart of every job because the
// API server was away for a while:
//   - A standby takes the Lease only once it has been unregistered for a while
//     (it cannot reach the rendezvous: the serving pod is gone, or the standby
//     is cut off itself) and the Lease has not changed for its whole duration
//     (measured on the standby's own clock, as client-go does: clocks may
//     disagree, their rates do not).
//   - The holder renews the Lease every Retry, and before anyone acts on a
//     member's departure (the survivors' restart) it renews once more: only
//     a renewal begun after the departure lets the change through; one that
//     fails or does not return within Confirm makes it step down first. A
//     holder cut off with a few members sees the others depart (their
//     registrations end on its store) and must not start a round of its own,
//     however short their lease: the renewal that would let it cannot reach
//     the API server. A standby's registration ends at the holder too, so a
//     standby that may take over has left the holder's membership first: a
//     holder cut off from the API server and from the standby steps down
//     before the standby can serve. A holder that only lost the API server
//     keeps every member and serves on; it takes the Lease back once it can.
//     (Patroni's failsafe mode rests on the same argument: a primary that
//     cannot reach its store stays primary only while it reaches every
//     member.)
//   - A holder that sees another pod hold the Lease steps down at once.
//
// client-go's leaderelection speaks the same Lease protocol, but its
// resourcelock package links client-go's whole clientset into the sidecar
// (50 to 70 MB), and its leader steps down on the first failed renewal.
package servinglease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Record is what the Lease says of its holder.
type Record struct {
	Holder      string // "" = nobody
	Duration    time.Duration
	Transitions int32
	// Version is the object's resourceVersion: an update with it fails when
	// someone else wrote in between.
	Version string
	// Renewed and Acquired are the holder's renewTime and acquireTime, what
	// kubectl shows: a standby judges by its own clock when the record last
	// changed, never by another pod's clock.
	Renewed, Acquired time.Time
}

// same says whether r and o are the same observation (the version says it).
func (r Record) same(o Record) bool { return r.Version == o.Version }

// API is what a candidate asks of the API server, about the Lease and the
// EndpointSlice of its name in the pod's namespace.
type API interface {
	// GetLease returns the Lease's record.
	GetLease(ctx context.Context) (Record, error)
	// UpdateLease writes rec if the Lease is still at rec.Version, and returns
	// the new record; a conflict error otherwise.
	UpdateLease(ctx context.Context, rec Record) (Record, error)
	// Endpoint returns the address the EndpointSlice points at ("" = none).
	Endpoint(ctx context.Context) (string, error)
	// SetEndpoint points the EndpointSlice at address, pod ("" = none).
	SetEndpoint(ctx context.Context, address, pod string) error
}

// Config configures a Candidate.
type Config struct {
	API API
	// Identity is this pod's name, what the Lease names as its holder.
	Identity string
	// Address is this pod's IP, what the EndpointSlice points at while it holds the Lease.
	Address string
	// Duration is how long a Lease nobody renews stays its holder's; the
	// holder renews every Retry, and once more at a member's departure,
	// waiting at most Confirm before it steps down. Duration > Retry >=
	// Confirm > 0 (Check).
	Duration, Retry, Confirm time.Duration
	Log                      *slog.Logger
	// Now is the clock (tests); nil = time.Now.
	Now func() time.Time
}

// Defaults: a standby serves about Duration after the holder's last renewal.
const (
	DefaultDuration = 10 * time.Second
	DefaultRetry    = 2 * time.Second
	// DefaultConfirm: an API server answers a Lease write in milliseconds; the survivors of a lost node wait for
	// it, and a holder whose API server is slower than this at a departure hands the rendezvous to a standby.
	DefaultConfirm = time.Second
)

// Check says whether the durations are usable.
func (c Config) Check() error {
	if !(c.Duration > c.Retry && c.Retry >= c.Confirm && c.Confirm > 0) {
		return fmt.Errorf("lease durations: want duration (%s) > retry (%s) >= confirm (%s) > 0", c.Duration, c.Retry, c.Confirm)
	}
	if c.Duration%time.Second != 0 {
		return fmt.Errorf("lease duration %s: whole seconds (the Lease counts in seconds)", c.Duration)
	}
	return nil
}

// ErrSteppedDown is what Lead returns when this pod must stop serving.
var ErrSteppedDown = errors.New("stepped down")

// Candidate is one pod that may serve the rendezvous.
type Candidate struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	seen    Record    // the last record read or written
	seenAt  time.Time // when seen last changed, on this pod's clock
	renewed time.Time // when the last successful renewal began
	down    error     // why it serves no more (nil: it serves)
	kick    chan struct{}
	// renewing holds one renewal at a time: two would write the same version, and one would fail.
	renewing chan struct{}
}

// New returns a candidate.
func New(cfg Config) (*Candidate, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if cfg.Identity == "" || cfg.Address == "" {
		return nil, errors.New("a rendezvous candidate needs its pod's name and IP")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Candidate{cfg: cfg, log: log, kick: make(chan struct{}, 1), renewing: make(chan struct{}, 1)}, nil
}

// observe records rec as seen at now.
func (c *Candidate) observe(rec Record, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !rec.same(c.seen) || c.seenAt.IsZero() {
		c.seen, c.seenAt = rec, now
	}
}

// Handover is how this pod came to hold the Lease.
type Handover struct {
	From string // the previous holder ("" = nobody)
	// Released: the previous holder gave the Lease up (a graceful stop), when
	// this pod saw it free At; its store has just stopped.
	Released bool
	At       time.Time
	// NotBefore is when the caller lets Lead point the Service here (zero: at once).
	NotBefore time.Time
}

// Acquire returns once this pod holds the Lease, or with ctx's error. It
// reads the Lease every Retry and takes it when it is free, already this
// pod's, or expired while may() says this pod may take over.
func (c *Candidate) Acquire(ctx context.Context, may func() bool) (Handover, error) {
	var lastHolder string
	for {
		h, held, holder, err := c.tryAcquire(ctx, may)
		switch {
		case held:
			return h, nil
		case err != nil && ctx.Err() == nil:
			c.log.Warn("cannot read or take the rendezvous lease; retrying", "err", err)
		case holder != lastHolder:
			c.log.Info("the rendezvous is served by another pod; standing by", "holder", holder)
			lastHolder = holder
		}
		select {
		case <-ctx.Done():
			return Handover{}, ctx.Err()
		case <-time.After(c.cfg.Retry):
		}
	}
}

func (c *Candidate) tryAcquire(ctx context.Context, may func() bool) (Handover, bool, string, error) {
	rec, err := c.cfg.API.GetLease(ctx)
	if err != nil {
		return Handover{}, false, "", err
	}
	now := c.cfg.Now()
	c.observe(rec, now)
	c.mu.Lock()
	seenAt := c.seenAt
	c.mu.Unlock()
	if !mayTake(rec, c.cfg.Identity, seenAt, now, may) {
		return Handover{}, false, rec.Holder, nil
	}
	// A free Lease that was renewed once was given up; one never renewed is a new job's.
	h := Handover{From: rec.Holder, Released: rec.Holder == "" && !rec.Renewed.IsZero(), At: seenAt}
	next := rec
	if rec.Holder != c.cfg.Identity {
		next.Transitions++
		next.Acquired = now
	}
	next.Holder, next.Duration, next.Renewed = c.cfg.Identity, c.cfg.Duration, now
	got, err := c.cfg.API.UpdateLease(ctx, next)
	if err != nil {
		return Handover{}, false, rec.Holder, fmt.Errorf("take the lease from %q: %w", rec.Holder, err)
	}
	c.mu.Lock()
	c.seen, c.seenAt, c.renewed = got, now, now
	c.mu.Unlock()
	c.log.Info("this pod serves the rendezvous now: it holds the lease", "previous_holder", rec.Holder, "released", h.Released, "transitions", got.Transitions)
	return h, true, c.cfg.Identity, nil
}

// mayTake is the candidate's rule: a free Lease or its own it takes at
// once; another's only once that has not changed for its whole duration on
// this pod's clock, and only if may() says so.
func mayTake(rec Record, me string, seenAt, now time.Time, may func() bool) bool {
	switch {
	case rec.Holder == "" || rec.Holder == me:
		return true
	case now.Sub(seenAt) < rec.Duration:
		return false
	default:
		return may == nil || may()
	}
}

// MembersChanged tells the holder of the membership's changes. At a
// departure it returns only once it has renewed the Lease since, or decided
// to step down (Serving says so to the listeners after it): it blocks its
// caller for at most Confirm. (The membership's watch coalesces what queued
// meanwhile: a burst of departures costs a write per wait, not per member.)
func (c *Candidate) MembersChanged(_, left []string) {
	if len(left) == 0 || !c.Serving() {
		return
	}
	departed := c.cfg.Now()
	err := c.confirm(departed)
	if err == nil {
		return
	}
	if !errors.Is(err, ErrSteppedDown) {
		names := strings.Join(left[:min(len(left), 3)], ",")
		if len(left) > 3 {
			names += ",..."
		}
		err = fmt.Errorf("%w: %d member(s) left (%s) and the lease could not be renewed since (it may serve elsewhere now): %w",
			ErrSteppedDown, len(left), names, err)
	}
	c.mu.Lock()
	if c.down == nil {
		c.down = err
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// confirm returns nil once a renewal begun at or after since has succeeded, waiting at most Confirm (for the
// renewal under way, then for one of its own).
func (c *Candidate) confirm(since time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Confirm)
	defer cancel()
	select {
	case c.renewing <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("the renewal under way has not returned within %s", c.cfg.Confirm)
	}
	c.mu.Lock()
	renewed := c.renewed
	c.mu.Unlock()
	if !renewed.Before(since) {
		<-c.renewing
		return nil
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-c.renewing }()
		done <- c.renewHeld(ctx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer within %s", c.cfg.Confirm)
	}
}

// Serving says whether this holder still serves: false once it must step down.
func (c *Candidate) Serving() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.down == nil
}

// Lead keeps the Lease and points the EndpointSlice at this pod, from
// publish on (zero: at once), until ctx ends or until this pod must step down
// (ErrSteppedDown, wrapped with the reason). Call it once Acquire returned
// and the rendezvous answers, and Release once it no longer does.
func (c *Candidate) Lead(ctx context.Context, publish time.Time) error {
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(time.Until(publish)): // the Lease was written just now: it holds for its Duration
	}
	if err := c.publish(ctx); err != nil && ctx.Err() == nil {
		c.log.Error("cannot point the rendezvous Service at this pod; retrying", "err", err)
	}
	tick := time.NewTicker(c.cfg.Retry)
	defer tick.Stop()
	// A renewal runs on its own: one that hangs (the API server cut off) must not keep this pod from hearing that
	// it must step down (MembersChanged kicks).
	results := make(chan error, 1)
	inFlight := false
	for n := 1; ; {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if !inFlight {
				inFlight = true
				// The Service must point here: a helm upgrade may have rendered an older address, or the first
				// write failed.
				publish := n%5 == 0
				n++
				go func() { results <- c.renewAndPublish(ctx, publish) }()
			}
		case err := <-results:
			inFlight = false
			if errors.Is(err, ErrSteppedDown) {
				return err
			}
			if err != nil && ctx.Err() == nil {
				c.log.Warn("cannot renew the rendezvous lease; serving on while no member leaves", "err", err)
			}
		case <-c.kick:
		}
		c.mu.Lock()
		down := c.down
		c.mu.Unlock()
		if down != nil {
			return down
		}
	}
}

// renewAndPublish renews the Lease, and with publish points the Service here too.
func (c *Candidate) renewAndPublish(ctx context.Context, publish bool) error {
	err := c.renew(ctx)
	if err == nil && publish {
		if err := c.publish(ctx); err != nil && ctx.Err() == nil {
			c.log.Error("cannot point the rendezvous Service at this pod; retrying", "err", err)
		}
	}
	return err
}

// renew writes the Lease again, after the renewal under way (confirm's); ErrSteppedDown when another pod holds it.
func (c *Candidate) renew(ctx context.Context) error {
	select {
	case c.renewing <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.renewing }()
	return c.renewHeld(ctx)
}

// renewHeld is renew, its caller holding c.renewing.
func (c *Candidate) renewHeld(ctx context.Context) error {
	c.mu.Lock()
	rec := c.seen
	c.mu.Unlock()
	now := c.cfg.Now()
	if rec.Holder != c.cfg.Identity {
		// Unconfirmed since a failed renewal: read it first.
		var err error
		if rec, err = c.cfg.API.GetLease(ctx); err != nil {
			return err
		}
		c.observe(rec, now)
	}
	if rec.Holder != "" && rec.Holder != c.cfg.Identity {
		return fmt.Errorf("%w: pod %s holds the rendezvous lease now", ErrSteppedDown, rec.Holder)
	}
	next := rec
	if rec.Holder != c.cfg.Identity {
		next.Acquired = now
	}
	next.Holder, next.Duration, next.Renewed = c.cfg.Identity, c.cfg.Duration, now
	got, err := c.cfg.API.UpdateLease(ctx, next)
	if err != nil {
		// Read it again at the next try (a conflict: someone wrote in between).
		c.mu.Lock()
		c.seen = Record{Version: "?"}
		c.mu.Unlock()
		return err
	}
	c.mu.Lock()
	c.seen, c.seenAt, c.renewed = got, now, now
	c.mu.Unlock()
	return nil
}

// publish points the EndpointSlice at this pod unless it does already.
func (c *Candidate) publish(ctx context.Context) error {
	addr, err := c.cfg.API.Endpoint(ctx)
	if err != nil {
		return err
	}
	if addr == c.cfg.Address {
		return nil
	}
	if err := c.cfg.API.SetEndpoint(ctx, c.cfg.Address, c.cfg.Identity); err != nil {
		return err
	}
	c.log.Info("the rendezvous Service points at this pod", "address", c.cfg.Address, "previous", addr)
	return nil
}

// Release gives the Lease up and empties the EndpointSlice, if they are still
// this pod's: on a graceful stop a standby takes over at once, and clients
// meet a refused connection instead of a silent one.
func (c *Candidate) Release() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if addr, err := c.cfg.API.Endpoint(ctx); err == nil && addr == c.cfg.Address {
		if err := c.cfg.API.SetEndpoint(ctx, "", ""); err != nil {
			c.log.Warn("could not empty the rendezvous Service's endpoint", "err", err)
		}
	}
	rec, err := c.cfg.API.GetLease(ctx)
	if err != nil || rec.Holder != c.cfg.Identity {
		return
	}
	rec.Holder, rec.Duration, rec.Renewed, rec.Acquired = "", time.Second, c.cfg.Now(), time.Time{}
	if _, err := c.cfg.API.UpdateLease(ctx, rec); err != nil {
		c.log.Warn("could not release the rendezvous lease; a standby takes it once it expires", "err", err)
		return
	}
	c.log.Info("released the rendezvous lease")
}
