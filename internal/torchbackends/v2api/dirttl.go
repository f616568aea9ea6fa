package v2api

import (
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
)

// Directory TTLs.
//
// etcd's v2 store can give a directory a TTL when it is created, but it can
// never change it: Update (and so refresh=true) on a directory fails with
// "Not a file" (etcd-io/etcd#13589; still true of v2store in etcd 3.7).
// torch's `etcd` rendezvous backend creates its run directory run_<id> with
// ttl=7200 and refreshes it every hour; against real etcd the refresh thread
// dies on that error and after two hours the run directory expires under a
// live job, so a later joiner silently trains in a separate world.
//
// So we keep directory TTLs here, in the front end, and never in the store:
// directories are created permanent in the store; dirTTLs records the TTL
// each one asked for; refreshes and TTL updates of a directory succeed and
// move its deadline; and the expiry loop deletes a directory only when its
// deadline has passed AND nothing under it was written for one whole TTL AND
// no key under it still has a live TTL. A live torch job keeps TTL keys
// alive under its run directory (its workers' keep-alive keys, refreshed
// every 5 s), so its run directory cannot expire while the job lives,
// whatever TTL it asked for; once the job is gone, those keys expire and the
// directory follows. Responses show the directory's ttl and expiration as
// etcd would.
//
// Deviation from etcd: the watch event of such a directory's expiry has
// action "delete" (the store's recursive delete), not "expire".
type dirTTLs struct {
	mu     sync.Mutex
	maxTTL time.Duration // caps requested directory TTLs; 0 = no cap
	dirs   map[string]*dirTTL
}

type dirTTL struct {
	ttl          time.Duration
	deadline     time.Time // from the last create/refresh
	lastWrite    time.Time // last successful write at or under the directory
	createdIndex uint64    // guards against a recreated directory of the same name
}

func newDirTTLs(maxTTL time.Duration) *dirTTLs {
	return &dirTTLs{maxTTL: maxTTL, dirs: map[string]*dirTTL{}}
}

func (d *dirTTLs) clamp(ttl time.Duration) time.Duration {
	if d.maxTTL > 0 && ttl > d.maxTTL {
		return d.maxTTL
	}
	return ttl
}

// set records (ttl > 0) or clears (ttl == 0) the TTL of directory p.
func (d *dirTTLs) set(p string, ttl time.Duration, createdIndex uint64, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ttl <= 0 {
		delete(d.dirs, p)
		return
	}
	ttl = d.clamp(ttl)
	d.dirs[p] = &dirTTL{ttl: ttl, deadline: now.Add(ttl), lastWrite: now, createdIndex: createdIndex}
}

// expiration is when p expires if nothing else happens, or false if p has
// no TTL.
func (d *dirTTLs) expiration(p string) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.dirs[p]
	if !ok {
		return time.Time{}, false
	}
	return e.expiry(), true
}

func (e *dirTTL) expiry() time.Time {
	if w := e.lastWrite.Add(e.ttl); w.After(e.deadline) {
		return w
	}
	return e.deadline
}

func (d *dirTTLs) empty() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.dirs) == 0
}

// touch notes a write at p: every TTL directory at or above p stays alive
// for another TTL.
func (d *dirTTLs) touch(p string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.dirs) == 0 {
		return
	}
	for q := p; ; {
		if e, ok := d.dirs[q]; ok {
			e.lastWrite = now
		}
		i := strings.LastIndexByte(q, '/')
		if i <= 0 {
			return
		}
		q = q[:i]
	}
}

// forget drops p and everything under it (after a delete or expiry).
func (d *dirTTLs) forget(p string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for q := range d.dirs {
		if q == p || strings.HasPrefix(q, p+"/") {
			delete(d.dirs, q)
		}
	}
}

// postpone moves p's deadline to at least t.
func (d *dirTTLs) postpone(p string, t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.dirs[p]; ok && e.deadline.Before(t) {
		e.deadline = t
	}
}

// due returns the directories whose time is up.
func (d *dirTTLs) due(now time.Time) map[string]uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out map[string]uint64
	for p, e := range d.dirs {
		if !now.Before(e.expiry()) {
			if out == nil {
				out = map[string]uint64{}
			}
			out[p] = e.createdIndex
		}
	}
	return out
}

// decorate fills in ttl and expiration of TTL directories in n and its
// children, as etcd shows them for a node with a TTL.
func (d *dirTTLs) decorate(n *v2store.NodeExtern, now time.Time) {
	if n == nil || d.empty() {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var walk func(n *v2store.NodeExtern)
	walk = func(n *v2store.NodeExtern) {
		if !n.Dir {
			return
		}
		if e, ok := d.dirs[n.Key]; ok {
			exp := e.expiry().UTC()
			n.Expiration = &exp
			n.TTL = ttlSeconds(exp, now)
		}
		for _, c := range n.Nodes {
			walk(c)
		}
	}
	walk(n)
}

// ttlSeconds is etcd's ceiling((exp - now) / 1s).
func ttlSeconds(exp, now time.Time) int64 {
	left := exp.Sub(now)
	ttl := left / time.Second
	if left%time.Second > 0 {
		ttl++
	}
	return int64(ttl)
}
