package servinglease

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMayTake(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	yes, no := func() bool { return true }, func() bool { return false }
	held := Record{Holder: "other", Duration: 10 * time.Second}
	for _, tc := range []struct {
		name string
		rec  Record
		age  time.Duration // since the record last changed, on this pod's clock
		may  func() bool
		want bool
	}{
		{"free", Record{}, 0, no, true},
		{"released", Record{Holder: "", Duration: time.Second}, 0, no, true},
		{"mine", Record{Holder: "me", Duration: 10 * time.Second}, 0, no, true},
		{"another's, fresh", held, 9 * time.Second, yes, false},
		{"another's, unchanged for its duration", held, 10 * time.Second, yes, true},
		{"another's, expired, but this pod may not (still registered)", held, time.Minute, no, false},
		{"another's, expired, no gate", held, 10 * time.Second, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, mayTake(tc.rec, "me", t0, t0.Add(tc.age), tc.may))
		})
	}
}

// TestDepartureConfirmed: a member's departure reaches the listeners only once the holder has renewed the Lease
// since; a renewal that fails, does not return, or finds another holder makes it step down first.
func TestDepartureConfirmed(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before the departure: renewedAt says a renewal began at the departure's moment; hungRenewal that a renewal
		// is under way and does not return.
		renewedAt, hungRenewal bool
		api                    string // "up", "down" (fails at once), "hung" (never answers), "taken" (another pod holds it)
		serving                bool
		wantErr                string
	}{
		{name: "the API server answers", api: "up", serving: true},
		{name: "renewed at the departure already: no write needed", renewedAt: true, api: "down", serving: true},
		{name: "the API server is away", api: "down", wantErr: "1 member(s) left (worker-2)"},
		{name: "the API server does not answer (cut off)", api: "hung", wantErr: "no answer within"},
		{name: "a renewal under way does not return", hungRenewal: true, api: "up", wantErr: "the renewal under way has not returned"},
		{name: "another pod took the Lease", api: "taken", wantErr: "pod worker-1 holds the rendezvous lease now"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &memAPI{down: map[string]bool{}, hang: make(chan struct{})}
			defer close(m.hang)
			clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			c, err := New(Config{API: apiOf{m, "worker-0"}, Identity: "worker-0", Address: "10.0.0.1",
				Duration: DefaultDuration, Retry: DefaultRetry, Confirm: 50 * time.Millisecond, Now: clk.Now})
			require.NoError(t, err)
			_, held, _, err := c.tryAcquire(t.Context(), nil)
			require.NoError(t, err)
			require.True(t, held)
			if !tc.renewedAt {
				clk.add(time.Second)
			}
			if tc.hungRenewal {
				m.setHung("worker-0", true)
				go c.renew(t.Context()) //nolint:errcheck // never returns before the test's end
				require.Eventually(t, func() bool { return m.waiting() == 1 }, 10*time.Second, time.Millisecond)
				m.setHung("worker-0", false)
			}
			version := m.rec.Version
			switch tc.api {
			case "down":
				m.setDown("worker-0", true)
			case "hung":
				m.setHung("worker-0", true)
			case "taken":
				m.mu.Lock()
				m.rec.Holder, m.rec.Version = "worker-1", "other"
				m.mu.Unlock()
				c.mu.Lock()
				c.seen = Record{Version: "?"} // as after a conflict: it reads the Lease first
				c.mu.Unlock()
			}
			c.MembersChanged(nil, []string{"worker-2"}) // returns: it waits at most Confirm
			assert.Equal(t, tc.serving, c.Serving())
			if tc.serving {
				if tc.api == "up" {
					assert.NotEqual(t, version, m.rec.Version, "the departure went through without a renewal")
				}
				return
			}
			c.mu.Lock()
			down := c.down
			c.mu.Unlock()
			require.ErrorIs(t, down, ErrSteppedDown)
			assert.ErrorContains(t, down, tc.wantErr)
			// Lead returns the reason at once.
			assert.ErrorIs(t, c.Lead(t.Context(), time.Time{}), ErrSteppedDown)
		})
	}
}

// memAPI is an in-memory Lease and EndpointSlice with resourceVersions; down
// makes every request fail, as a pod cut off from the API server sees it.
type memAPI struct {
	mu      sync.Mutex
	rec     Record
	version int
	addr    string
	down    map[string]bool // by identity
	// hung: UpdateLease of these identities does not answer until hang is closed or its context ends.
	hung    map[string]bool
	hang    chan struct{}
	blocked int // requests waiting on hang
}

type apiOf struct {
	m  *memAPI
	id string
}

var errDown = errors.New("API server unreachable")

func (a apiOf) GetLease(context.Context) (Record, error) {
	a.m.mu.Lock()
	defer a.m.mu.Unlock()
	if a.m.down[a.id] {
		return Record{}, errDown
	}
	return a.m.rec, nil
}

func (a apiOf) UpdateLease(ctx context.Context, rec Record) (Record, error) {
	a.m.mu.Lock()
	if a.m.hung[a.id] {
		a.m.blocked++
		a.m.mu.Unlock()
		select {
		case <-a.m.hang:
		case <-ctx.Done():
		}
		a.m.mu.Lock()
		a.m.blocked--
		a.m.mu.Unlock()
		return Record{}, errors.New("no answer")
	}
	defer a.m.mu.Unlock()
	if a.m.down[a.id] {
		return Record{}, errDown
	}
	if rec.Version != a.m.rec.Version {
		return Record{}, errors.New("conflict")
	}
	a.m.version++
	rec.Version = strconv.Itoa(a.m.version)
	a.m.rec = rec
	return rec, nil
}

func (a apiOf) Endpoint(context.Context) (string, error) {
	a.m.mu.Lock()
	defer a.m.mu.Unlock()
	if a.m.down[a.id] {
		return "", errDown
	}
	return a.m.addr, nil
}

func (a apiOf) SetEndpoint(_ context.Context, addr, _ string) error {
	a.m.mu.Lock()
	defer a.m.mu.Unlock()
	if a.m.down[a.id] {
		return errDown
	}
	a.m.addr = addr
	return nil
}

func (m *memAPI) setDown(id string, down bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down[id] = down
}

func (m *memAPI) setHung(id string, hung bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hung == nil {
		m.hung = map[string]bool{}
	}
	m.hung[id] = hung
}

func (m *memAPI) waiting() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.blocked
}

// clock is a manual clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

func candidate(t *testing.T, m *memAPI, clk *clock, id, addr string) *Candidate {
	t.Helper()
	c, err := New(Config{API: apiOf{m, id}, Identity: id, Address: addr, Duration: DefaultDuration,
		Retry: DefaultRetry, Confirm: DefaultConfirm, Now: clk.Now})
	require.NoError(t, err)
	return c
}

// TestHandover drives two candidates step by step on a manual clock: the
// holder that loses the API server serves on while its members stay, steps
// down once one leaves; the standby takes the Lease only once it may (it left
// the holder's membership) and the Lease has gone unchanged for its duration.
func TestHandover(t *testing.T) {
	ctx := t.Context()
	m := &memAPI{down: map[string]bool{}}
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := candidate(t, m, clk, "worker-0", "10.0.0.1")
	b := candidate(t, m, clk, "worker-1", "10.0.0.2")
	registered := true
	mayB := func() bool { return !registered }

	h, held, _, err := a.tryAcquire(ctx, nil)
	require.NoError(t, err)
	require.True(t, held, "a free Lease is taken at once")
	assert.False(t, h.Released, "a Lease nobody ever held was not given up")
	require.NoError(t, a.publish(ctx))
	assert.Equal(t, "10.0.0.1", m.addr)

	// A member leaving while a renews is a worker's loss, nothing more.
	a.MembersChanged(nil, []string{"worker-7"})
	assert.True(t, a.Serving())

	// b stands by while a renews.
	for range 10 {
		clk.add(DefaultRetry)
		require.NoError(t, a.renew(ctx))
		_, held, holder, err := b.tryAcquire(ctx, func() bool { return true })
		require.NoError(t, err)
		require.False(t, held)
		assert.Equal(t, "worker-0", holder)
	}

	// a loses the API server: it cannot renew, yet serves on while nobody leaves.
	m.setDown("worker-0", true)
	for range 15 {
		clk.add(DefaultRetry)
		assert.Error(t, a.renew(ctx))
		_, held, _, _ := b.tryAcquire(ctx, mayB)
		assert.False(t, held, "b is registered with a: it must not take over")
		assert.True(t, a.Serving(), "a serves on: no member left")
	}

	// The API server comes back: a takes its own Lease back at once.
	m.setDown("worker-0", false)
	clk.add(DefaultRetry)
	require.NoError(t, a.renew(ctx))
	assert.Equal(t, "worker-0", m.rec.Holder)

	// a is cut off from everything: b's registration ends (it leaves a's membership, which a sees), and only then
	// may b take the Lease, once unchanged for its duration.
	m.setDown("worker-0", true)
	clk.add(5 * time.Second)
	a.MembersChanged(nil, []string{"worker-1"})
	assert.False(t, a.Serving(), "a member left while a could not renew: a steps down before the survivors hear of it")
	registered = false
	var takenAt time.Duration
	for i := 1; takenAt == 0 && i < 20; i++ {
		clk.add(time.Second)
		a.renew(ctx) //nolint:errcheck // cut off
		h, held, _, err := b.tryAcquire(ctx, mayB)
		require.NoError(t, err)
		if held {
			takenAt = 5*time.Second + time.Duration(i)*time.Second
			assert.False(t, a.Serving(), "a must have stepped down before b holds the Lease")
			assert.Equal(t, Handover{From: "worker-0", At: h.At}, h, "an expired Lease was not given up")
		}
	}
	assert.Equal(t, "worker-1", m.rec.Holder)
	assert.Equal(t, int32(2), m.rec.Transitions)
	t.Logf("b took the Lease %v after a was cut off", takenAt)
	require.NoError(t, b.publish(ctx))
	assert.Equal(t, "10.0.0.2", m.addr)

	// a comes back: it sees b's Lease and steps down at once.
	m.setDown("worker-0", false)
	err = a.renew(ctx)
	assert.ErrorIs(t, err, ErrSteppedDown)

	// b stops gracefully: the Lease is free and the Service empty at once.
	b.Release()
	assert.Equal(t, "", m.rec.Holder)
	assert.Equal(t, "", m.addr)
	h, held, _, err = a.tryAcquire(ctx, func() bool { return false })
	require.NoError(t, err)
	assert.True(t, held, "a released Lease is taken without waiting")
	assert.True(t, h.Released, "b gave it up: a lets b's members go before it points the Service at itself")
}

// follower is a join that registers at once and stays until abandoned, or fails with err.
type follower struct {
	err       error
	abandoned chan struct{}
}

func (f *follower) Follow(ctx context.Context, registered func(bool), abandon <-chan struct{}) error {
	if f.err != nil {
		return f.err
	}
	registered(true)
	registered(false) // the pod that served is gone: its registration ended
	select {
	case <-abandon:
		close(f.abandoned)
	case <-ctx.Done():
	}
	return nil
}

// TestFollow: a candidate follows until it holds the Lease, which it takes
// from a holder gone silent once the Lease has not changed for its duration
// and its own registration is gone, and then abandons the registration; a
// join that fails ends the following with its error.
func TestFollow(t *testing.T) {
	m := &memAPI{down: map[string]bool{}, rec: Record{Holder: "worker-0", Duration: time.Second, Version: "1"}}
	c, err := New(Config{API: apiOf{m, "worker-1"}, Identity: "worker-1", Address: "10.0.0.2",
		Duration: time.Second, Retry: 100 * time.Millisecond, Confirm: 100 * time.Millisecond})
	require.NoError(t, err)
	f := &follower{abandoned: make(chan struct{})}
	start := time.Now()
	_, err = c.Follow(t.Context(), f, false)
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), time.Second, "took the Lease before it went unchanged for its duration")
	<-f.abandoned
	require.Equal(t, "worker-1", m.rec.Holder)

	m.rec.Holder = "worker-0" // another's again: the failed join comes first
	_, err = c.Follow(t.Context(), &follower{err: errDown}, false)
	require.ErrorIs(t, err, errDown)
	require.ErrorContains(t, err, "following the rendezvous")
}
