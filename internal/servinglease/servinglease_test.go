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

func TestMustStepDown(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const stale, slow = 4 * time.Second, time.Second
	for _, tc := range []struct {
		name              string
		departed, now     time.Duration // after the last renewal; departed < 0: before it
		attempt           time.Duration // a renewal in flight since (0: none)
		failed            bool
		noDeparture, want bool
	}{
		{name: "renewed lately, a member left", departed: time.Second, now: 2 * time.Second, want: false},
		{name: "not renewed for long, nobody left (the API server is away)", noDeparture: true, now: time.Minute, want: false},
		{name: "not renewed for long, a member left before the last renewal", departed: -time.Second, now: time.Minute, want: false},
		{name: "not renewed for long, a member left since", departed: 5 * time.Second, now: 5 * time.Second, want: true},
		{name: "a member left, one renewal late", departed: 3 * time.Second, now: 3 * time.Second, want: false},
		{name: "a member left, then a renewal went missing", departed: 3 * time.Second, now: 5 * time.Second, want: true},
		// Cut off just after a renewal: the members' registrations expire 3.3 to 5 s later, while the next renewal
		// (begun 2 s after the last) hangs.
		{name: "a member left while a renewal hangs", departed: 3500 * time.Millisecond, now: 3500 * time.Millisecond, attempt: 2 * time.Second, want: true},
		{name: "a member left while a renewal is under way", departed: 2500 * time.Millisecond, now: 2500 * time.Millisecond, attempt: 2 * time.Second, want: false},
		{name: "a member left after a renewal failed", departed: 3 * time.Second, now: 3 * time.Second, failed: true, want: true},
		{name: "a renewal failed, nobody left", noDeparture: true, now: 3 * time.Second, failed: true, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := standing{renewed: t0, departed: t0.Add(tc.departed), failed: tc.failed}
			if tc.noDeparture {
				s.departed = time.Time{}
			}
			if tc.attempt != 0 {
				s.attempt = t0.Add(tc.attempt)
			}
			assert.Equal(t, tc.want, mustStepDown(s, t0.Add(tc.now), stale, slow))
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

func (a apiOf) UpdateLease(_ context.Context, rec Record) (Record, error) {
	a.m.mu.Lock()
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
		Stale: DefaultStale, Retry: DefaultRetry, Now: clk.Now})
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
		assert.False(t, a.stepDown(), "a serves on: no member left")
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
			assert.True(t, a.stepDown(), "a must have stepped down before b holds the Lease")
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
		Duration: time.Second, Stale: 200 * time.Millisecond, Retry: 100 * time.Millisecond})
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
