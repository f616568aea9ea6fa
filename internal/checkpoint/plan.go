package checkpoint

import (
	"hash/fnv"
	"slices"
	"strconv"
)

// Holder is a pod that may hold pieces: a member of the job (its host, as
// registered) and the node it runs on ("" when unknown).
type Holder struct{ Host, Node string }

// Desired are the holders that should hold p, copies of them (the piece's
// origin and checkpoint.replicas others): the origin first if it is a member,
// then, one at a time, the member with the highest score among those on a node
// that holds none yet, or among all when every node holds one. The score is
// rendezvous hashing of (member, piece), so a change of membership moves only
// the copies of the members it touches.
func Desired(p Piece, origin string, members []Holder, copies int) []string {
	chosen := []string{}
	nodes := map[string]bool{}
	taken := map[string]bool{}
	for _, m := range members {
		if m.Host == origin {
			chosen, taken[m.Host] = append(chosen, m.Host), true
			if m.Node != "" {
				nodes[m.Node] = true
			}
		}
	}
	key := p.Save + "/" + strconv.Itoa(p.Rank)
	for len(chosen) < copies {
		best, bestOther, bestScore := -1, false, uint64(0)
		for i, m := range members {
			if taken[m.Host] {
				continue
			}
			other := m.Node == "" || !nodes[m.Node]
			s := score(m.Host, key)
			if best < 0 || other && !bestOther || other == bestOther && s > bestScore {
				best, bestOther, bestScore = i, other, s
			}
		}
		if best < 0 {
			break
		}
		m := members[best]
		chosen, taken[m.Host] = append(chosen, m.Host), true
		if m.Node != "" {
			nodes[m.Node] = true
		}
	}
	return chosen
}

// score is FNV-1a of host and key through murmur3's finaliser (FNV alone
// scores hosts that differ in their last character too alike).
func score(host, key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(host))
	h.Write([]byte{0})
	h.Write([]byte(key))
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// Plan is what one holder should do now.
type Plan struct {
	Fetch []Piece  // copies this holder should hold and does not, newest save first
	Drop  []string // saves in this holder's directory to remove
}

// Plan says what self should fetch and drop: the saves to keep are the newest
// one complete among the members and any newer (saves in progress), and while
// the newest has fewer holders per piece than it should, the newest complete
// one that has them all (else the complete one before it): a node lost now
// would otherwise lose every save it holds a piece of. Copies that lag the
// saves (a step shorter than a copy takes) thus keep the last save a loss
// leaves whole, not the one before the newest, which lags too. Self fetches
// the pieces of those saves that
// Desired gives it; it drops every other save it holds (held: the saves in its
// directory, announced or not), except a save not announced yet that is not
// older than the newest complete one (the trainer may be writing it). With no
// complete save, it keeps everything.
func (ix *Index) Plan(self string, members []Holder, replicas int, held []string) Plan {
	copies := replicas + 1
	keep := map[string]bool{}
	saves := ix.Saves()
	newest, complete := ix.NewestAmong(MemberOf(members))
	for _, name := range saves {
		keep[name] = true
		if complete && name == newest.Save {
			break
		}
	}
	if n := min(copies, len(members)); complete && !ix.replicated(newest.Save, n) {
		fallback := ""
		for _, name := range saves {
			if keep[name] || !ix.CompleteAmong(name, MemberOf(members)) {
				continue
			}
			if fallback == "" {
				fallback = name
			}
			if ix.replicated(name, n) {
				fallback = name
				break
			}
		}
		if fallback != "" {
			keep[fallback] = true
		}
	}
	var plan Plan
	for _, name := range saves {
		if !keep[name] {
			continue
		}
		for _, p := range ix.Pieces(name) {
			origin, _ := ix.Origin(p)
			holders := ix.Holders(p)
			if slices.Contains(holders, self) {
				continue
			}
			if slices.Contains(Desired(p, origin, members, copies), self) {
				plan.Fetch = append(plan.Fetch, p)
			}
		}
	}
	for _, name := range held {
		if keep[name] {
			continue
		}
		if _, announced := ix.saves[name]; !announced {
			// Not announced yet: a save the trainer may be writing now. Only one older than the newest complete
			// save is left over (a save that failed, a copy whose fetch was cut).
			step, err := ParseSaveName(name)
			if err == nil && (!complete || step >= newest.Step) {
				continue
			}
		}
		plan.Drop = append(plan.Drop, name)
	}
	return plan
}

// MemberOf says whether a host is one of members.
func MemberOf(members []Holder) func(string) bool {
	set := make(map[string]bool, len(members))
	for _, m := range members {
		set[m.Host] = true
	}
	return func(host string) bool { return set[host] }
}

// replicated: every piece of save has at least n holders.
func (ix *Index) replicated(save string, n int) bool {
	for _, p := range ix.Pieces(save) {
		if len(ix.Holders(p)) < n {
			return false
		}
	}
	return true
}
