package sidecar

import "github.com/elastic-training/elastic-training/internal/servinglease"

// MembershipListener is told of each change of the job's membership (the
// sidecars' lease-bound registrations): the member hosts that joined and
// left. It must not block: the membership's watch waits for it.
type MembershipListener interface {
	MembersChanged(joined, left []string)
}

// membershipFanOut tells every listener of a change, in its order. The
// serving sidecar's order (serve) is the Lease candidate first, since
// whether this pod still serves decides what the others do with a
// departure; then the lost-pod reaper; then the elastic-training backend's rounds and
// the survivors' restarter, behind whileServing.
type membershipFanOut []MembershipListener

func (f membershipFanOut) MembersChanged(joined, left []string) {
	for _, l := range f {
		l.MembersChanged(joined, left)
	}
}

// whileServing passes a change on only while this pod serves the
// rendezvous (always, without a Lease): a holder that steps down at this
// departure must not start a round of its own first.
type whileServing struct {
	cand *servinglease.Candidate // nil: no Lease, this pod serves
	next MembershipListener
}

func (w whileServing) MembersChanged(joined, left []string) {
	if w.cand == nil || w.cand.Serving() {
		w.next.MembersChanged(joined, left)
	}
}

// StoreWriteListener is handed each SET and stored COMPARE_SET of the c10d
// store (the key as the client sent it, with torch's "/"), after the write
// and outside the store's locks. It must not block: the client waits.
type StoreWriteListener interface {
	C10dWrite(key string, value []byte)
}

// storeWriteFanOut hands a write to every listener, in its order: the view
// of torch's rounds first (it only reads), then the elastic-training backend's rounds
// (internal/rdzv/c10drounds) and the survivors' restarter, which write back.
type storeWriteFanOut []StoreWriteListener

func (f *storeWriteFanOut) C10dWrite(key string, value []byte) {
	for _, l := range *f {
		l.C10dWrite(key, value)
	}
}
