// Package torchrounds follows the rounds of torch's own rendezvous backends (c10d, etcd-v2, etcd) through the
// writes their stores hand it, for the view (internal/torchview): it recognises the write that completes a round,
// keeps each run's pickled state as stored, and decodes it (internal/torchbackends/torchstate) once per change and
// only when a round or the view asks. The elastic-training backend tells the view its state itself and needs none
// of this.
package torchrounds

import (
	"strconv"
	"strings"
	"sync"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/torchbackends/torchstate"
	"github.com/elastic-training/elastic-training/internal/torchview"
)

// maxRuns bounds the runs whose state a Follower keeps: a job has one run at a time, a few more when it is
// reinstalled with the same sidecar. maxStateBytes bounds their states together: a state is the store's value,
// held by reference, so a run remembered keeps a value the store has replaced alive outside the store's quota
// (16 runs of the largest value were 128 MiB).
const (
	maxRuns       = 16
	maxStateBytes = 32 << 20
)

// View is what a Follower tells: torchview.Tracker.
type View interface {
	SetState(backend, run string, s torchview.RunState)
	Round(r torchview.Round, nodes []string)
}

// Follower follows torch's rounds for a View.
type Follower struct {
	view View

	mu    sync.Mutex
	runs  map[runKey]*pickled
	seq   uint64 // orders runs by their last write, for eviction
	shown runKey // the run of the last round reported: never forgotten
}

type runKey struct{ backend, id string }

// pickled is one run's state as stored (base64 of the pickle) and its decoding, made once per change and only
// when asked; the View holds it as the run's torchview.RunState.
type pickled struct {
	f         *Follower
	state     []byte
	decoded   *torchstate.State
	decodeErr error
	seq       uint64
}

// New returns a Follower that tells view.
func New(view View) *Follower {
	return &Follower{view: view, runs: map[runKey]*pickled{}}
}

// V2Write is the v2 keys API's v2api.Config.OnWrite: the etcd and etcd-v2 backends' writes, keys as clients name
// them.
func (f *Follower) V2Write(key, value string) {
	if run, ok := torchstate.StateRun(constants.BackendEtcdV2, key); ok {
		f.setState(runKey{constants.BackendEtcdV2, run}, []byte(value))
		return
	}
	if r, ok := roundFromEvent(key, value); ok {
		f.round(r)
	}
}

// C10dWrite is the c10d store's tcpstore.Config.OnSet and OnCompareSet. torch's TCPStore client puts "/" in front
// of every key.
func (f *Follower) C10dWrite(key string, value []byte) {
	key = strings.TrimPrefix(key, "/")
	if run, ok := torchstate.StateRun(constants.BackendC10d, key); ok {
		f.setState(runKey{constants.BackendC10d, run}, value)
		return
	}
	if r, ok := roundFromStoreKey(constants.BackendC10d, key, string(value)); ok {
		f.round(r)
	}
}

func (f *Follower) setState(k runKey, state []byte) {
	f.mu.Lock()
	p := f.runLocked(k)
	p.state, p.decoded, p.decodeErr = state, nil, nil
	for f.stateBytesLocked() > maxStateBytes && f.evictLocked(k) {
	}
	f.mu.Unlock()
	f.view.SetState(k.backend, k.id, p)
}

// round reports r with its nodes, from the run's state when the Follower has the state of that round.
func (f *Follower) round(r torchview.Round) {
	k := runKey{r.Backend, r.RunID}
	var nodes []string
	f.mu.Lock()
	f.shown = k
	if p := f.runs[k]; p != nil && p.state != nil {
		st, err := p.decodeLocked()
		r.StateErr = err
		if err == nil && strconv.Itoa(st.Round) == r.Round {
			r.Participants = len(st.Participants)
			for _, pt := range st.Participants {
				nodes = append(nodes, pt.Addr)
			}
		}
	}
	f.mu.Unlock()
	f.view.Round(r, nodes)
}

// stateBytesLocked is the size of the states the Follower keeps.
func (f *Follower) stateBytesLocked() int {
	n := 0
	for _, p := range f.runs {
		n += len(p.state)
	}
	return n
}

// runLocked returns k's run, making room for a new one by forgetting the run written to least recently.
func (f *Follower) runLocked(k runKey) *pickled {
	f.seq++
	if p, ok := f.runs[k]; ok {
		p.seq = f.seq
		return p
	}
	if len(f.runs) >= maxRuns {
		f.evictLocked(k)
	}
	p := &pickled{f: f, seq: f.seq}
	f.runs[k] = p
	return p
}

// evictLocked forgets the run written to least recently, but keep and the one of the last round reported; false
// when there is none to forget. The View may still hold the run: its state goes, so the memory does too.
func (f *Follower) evictLocked(keep runKey) bool {
	var oldest runKey
	var min uint64
	for rk, p := range f.runs {
		if rk != keep && rk != f.shown && (min == 0 || p.seq < min) {
			oldest, min = rk, p.seq
		}
	}
	if min == 0 {
		return false
	}
	p := f.runs[oldest]
	p.state, p.decoded, p.decodeErr = nil, nil, nil
	delete(f.runs, oldest)
	return true
}

// decodeLocked decodes the state, once per change.
func (p *pickled) decodeLocked() (torchstate.State, error) {
	if p.decoded == nil && p.decodeErr == nil {
		s, err := torchstate.DecodeBase64(p.state)
		p.decoded, p.decodeErr = &s, err
	}
	return *p.decoded, p.decodeErr
}

// Current is the run's state as the view shows it; ok false once the Follower forgot it.
func (p *pickled) Current() (torchview.Current, bool, error) {
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	if p.state == nil {
		return torchview.Current{}, false, nil
	}
	st, err := p.decodeLocked()
	if err != nil {
		return torchview.Current{}, true, err
	}
	c := torchview.Current{Round: st.Round, Complete: st.Complete, Closed: st.Closed}
	for _, pt := range st.Participants {
		vn := torchview.ViewNode{Node: pt.String(), Addr: pt.Addr, Rank: pt.Rank}
		if hb, ok := st.Heartbeats[pt.Node]; ok {
			vn.LastHeartbeat = &hb
		}
		c.Participants = append(c.Participants, vn)
	}
	for _, w := range st.Waiting {
		c.Waiting = append(c.Waiting, w.String())
	}
	return c, true, nil
}
