package servinglease

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Follower is this pod's part in the job while another pod serves (the
// sidecar's join): it runs until ctx ends, tells registered each time this
// pod's registration with the serving pod is made (true) or lost (false),
// and when abandon is closed it leaves without deregistering.
type Follower interface {
	Follow(ctx context.Context, registered func(bool), abandon <-chan struct{}) error
}

// Follow is a candidate's life while another pod serves: f takes part in the
// job (registers, keeps the files current, carries the trainer's c10d
// connections to the rendezvous Service) while c tries for the Lease, and
// Follow returns once c holds it (abandoning f's registration: that store is
// gone, or stopping), or when ctx ends. c tries for an expired Lease only
// after f's registration has been gone for Retry (the pod that serves is
// unreachable from here); a standby only after its first Lease duration.
func (c *Candidate) Follow(ctx context.Context, f Follower, standby bool) (Handover, error) {
	var mu sync.Mutex
	registered, since := false, time.Now()
	mark := func(r bool) { mu.Lock(); registered, since = r, time.Now(); mu.Unlock() }
	may := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !registered && time.Since(since) >= c.cfg.Retry
	}
	abandon := make(chan struct{})

	fctx, stop := context.WithCancel(ctx)
	defer stop()
	followed := make(chan error, 1)
	go func() { followed <- f.Follow(fctx, mark, abandon) }()
	type result struct {
		h   Handover
		err error
	}
	acquired := make(chan result, 1)
	go func() {
		if standby {
			select {
			case <-fctx.Done():
				acquired <- result{err: fctx.Err()}
				return
			case <-time.After(c.cfg.Duration):
			}
		}
		h, err := c.Acquire(fctx, may)
		acquired <- result{h, err}
	}()
	select {
	case err := <-followed:
		stop()
		<-acquired
		if ctx.Err() != nil {
			return Handover{}, nil
		}
		return Handover{}, fmt.Errorf("following the rendezvous: %w", err)
	case r := <-acquired:
		close(abandon)
		stop()
		<-followed
		if ctx.Err() != nil {
			return Handover{}, nil
		}
		return r.h, r.err
	}
}
