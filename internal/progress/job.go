package progress

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The hang rule's defaults (docs/hangs.md): torch finds a hang only when a collective times out (NCCL 10 min,
// gloo 30 min); a job with sub-second steps is found within a minute.
const (
	// MinTimeout is the least time without progress that is a hang, whatever the steps' time.
	MinTimeout = 60 * time.Second
	// StepFactor: a hang is also this many of the job's median step times without progress (a job of 20-minute
	// steps is not hung after a minute).
	StepFactor = 10
	// StragglerFactor: a rank whose step time is this many times the median is a straggler.
	StragglerFactor = 2
	// maxBlamed is the most ranks a verdict names.
	maxBlamed = 8
	// FrozenAfter: a rank not heard for this long (elastic_training.progress says its last step again every second
	// from a thread of its own) while another rank of the round was is frozen whole (stopped, or stuck holding
	// Python's lock), which ranks blocked in a collective are not: of a hung round, it is the one to blame.
	FrozenAfter = 5 * time.Second
)

// Job is one round's ranks as the serving sidecar follows them, from every pod's reports.
type Job struct {
	since time.Time // when the round formed: a rank that last advanced before it is of an earlier round
	ranks map[int]jobRank
	hosts map[string][]int // each host's ranks in its last report
	// expect is the round's ranks' hosts, by rank (Expect).
	expect []string
	// BlameAbsent: a rank that Expect names and that said nothing in the round is the one to blame when it hangs.
	// That holds where every rank reports (a rank frozen before its first step leaves the others waiting in their
	// first collective), not in a program whose rank 0 alone calls progress: set it once every rank has reported.
	BlameAbsent bool
}

// Expect tells the job its round's ranks: hosts[r] is rank r's host.
func (j *Job) Expect(hosts []string) { j.expect = hosts }

// Complete says whether every rank that Expect names has reported in this round.
func (j *Job) Complete() bool {
	if len(j.expect) == 0 {
		return false
	}
	for r := range j.expect {
		if _, ok := j.ranks[r]; !ok {
			return false
		}
	}
	return true
}

type jobRank struct {
	host        string
	step, total int64
	advanced    time.Time
	stepTime    time.Duration
	heard       time.Time
}

// NewJob returns the ranks of a round formed at since: none yet.
func NewJob(since time.Time) *Job {
	return &Job{since: since, ranks: map[int]jobRank{}, hosts: map[string][]int{}}
}

// Update takes host's report, received at now: it replaces what host reported before.
func (j *Job) Update(host string, r Report, now time.Time) {
	j.Forget(host)
	var mine []int
	for _, x := range r.Ranks {
		advanced := now.Add(-time.Duration(x.AgeMs) * time.Millisecond)
		if advanced.Before(j.since) {
			continue // a worker of an earlier round, or one that has said nothing since this round formed
		}
		if old, ok := j.ranks[x.Rank]; ok {
			j.hosts[old.host] = slices.DeleteFunc(j.hosts[old.host], func(n int) bool { return n == x.Rank })
		}
		j.ranks[x.Rank] = jobRank{host: host, step: x.Step, total: x.Total, advanced: advanced, stepTime: time.Duration(x.StepMs) * time.Millisecond,
			heard: now.Add(-time.Duration(x.SilentMs) * time.Millisecond)}
		mine = append(mine, x.Rank)
	}
	if len(mine) > 0 {
		j.hosts[host] = mine
	}
}

// Forget drops host's ranks (its member is gone).
func (j *Job) Forget(host string) {
	for _, n := range j.hosts[host] {
		if j.ranks[n].host == host {
			delete(j.ranks, n)
		}
	}
	delete(j.hosts, host)
}

// Verdict is the job's progress as of a moment.
type Verdict struct {
	Ranks       int           // ranks heard from in this round
	Step        int64         // the least step among them: every rank has done it
	Total       int64         // the steps in all, as the ranks said (0: unknown)
	StepTime    time.Duration // the median of the ranks' step times (0: unknown)
	Idle        time.Duration // since any rank last advanced
	Timeout     time.Duration // the hang timeout that applies
	Hung        bool          // no rank advanced for Timeout
	Stopped     []Blame       // with Hung: the ranks frozen whole (not heard while others were), else those that stopped first (least step, then earliest)
	Stragglers  []Straggler   // ranks that advance, StragglerFactor or more times slower than the median
	LastAdvance time.Time
}

// Blame is a rank that stopped: its host, its step, when it last advanced, and how long it has said nothing when
// it is frozen whole (0: it is not, or it cannot be told: the hint of its step alone).
type Blame struct {
	Rank     int
	Host     string
	Step     int64
	Advanced time.Time
	Silent   time.Duration
	Absent   bool // it said nothing in this round (Silent: since the round formed)
}

// String is "rank 3 (host) at step 120", with ", frozen (silent 62s)" when it is, or "rank 3 (host), no step said
// in this round (62s since it formed)": the logs' and Events' one way to name it.
func (b Blame) String() string {
	if b.Absent {
		return fmt.Sprintf("rank %d (%s), no step said in this round (%s since it formed)", b.Rank, b.Host, b.Silent.Round(time.Second))
	}
	s := fmt.Sprintf("rank %d (%s) at step %d", b.Rank, b.Host, b.Step)
	if b.Silent > 0 {
		s += fmt.Sprintf(", frozen (silent %s)", b.Silent.Round(time.Second))
	}
	return s
}

// Straggler is a slow rank and how many times the median its step time is.
type Straggler struct {
	Rank   int
	Host   string
	Slower float64
}

// String is "rank 2 (host) 3.1x".
func (s Straggler) String() string {
	return fmt.Sprintf("rank %d (%s) %.1fx", s.Rank, s.Host, s.Slower)
}

// Join names each of xs, comma-separated.
func Join[T fmt.Stringer](xs []T) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = x.String()
	}
	return strings.Join(parts, ", ")
}

// ETA is the time left at the median step time (0: unknown).
func (v Verdict) ETA() time.Duration {
	if v.Total <= v.Step || v.StepTime <= 0 {
		return 0
	}
	return time.Duration(v.Total-v.Step) * v.StepTime
}

// Rate is steps per second at the median step time (0: unknown).
func (v Verdict) Rate() float64 {
	if v.StepTime <= 0 {
		return 0
	}
	return float64(time.Second) / float64(v.StepTime)
}

// Judge says how the round's ranks stand at now; timeout 0: the default rule (the larger of MinTimeout and
// StepFactor median step times).
func (j *Job) Judge(now time.Time, timeout time.Duration) Verdict {
	v := Verdict{Ranks: len(j.ranks)}
	if v.Ranks == 0 {
		return v
	}
	times := make([]time.Duration, 0, len(j.ranks))
	all := make([]Blame, 0, len(j.ranks))
	v.Step = -1
	for n, r := range j.ranks {
		if r.stepTime > 0 {
			times = append(times, r.stepTime)
		}
		if v.Step < 0 || r.step < v.Step {
			v.Step = r.step
		}
		v.Total = max(v.Total, r.total)
		if r.advanced.After(v.LastAdvance) {
			v.LastAdvance = r.advanced
		}
		all = append(all, Blame{Rank: n, Host: r.host, Step: r.step, Advanced: r.advanced, Silent: now.Sub(r.heard)})
	}
	if len(times) > 0 {
		slices.Sort(times)
		v.StepTime = times[(len(times)-1)/2] // the lower median: of two ranks, the faster
	}
	v.Timeout = timeout
	if v.Timeout <= 0 {
		v.Timeout = max(MinTimeout, StepFactor*v.StepTime)
	}
	v.Idle = now.Sub(v.LastAdvance)
	if v.Hung = v.Idle >= v.Timeout; v.Hung {
		v.Stopped = blame(all)
		if absent := j.absent(now); j.BlameAbsent && len(absent) > 0 && len(absent) < len(j.expect) && !frozenAmong(v.Stopped) {
			v.Stopped = absent[:min(len(absent), maxBlamed)]
		}
		return v
	}
	if v.StepTime > 0 {
		for n, r := range j.ranks {
			if r.stepTime >= StragglerFactor*v.StepTime && now.Sub(r.advanced) < v.Timeout {
				v.Stragglers = append(v.Stragglers, Straggler{Rank: n, Host: r.host, Slower: float64(r.stepTime) / float64(v.StepTime)})
			}
		}
		slices.SortFunc(v.Stragglers, func(a, b Straggler) int { return cmp.Or(cmp.Compare(b.Slower, a.Slower), cmp.Compare(a.Rank, b.Rank)) })
		v.Stragglers = v.Stragglers[:min(len(v.Stragglers), maxBlamed)]
	}
	return v
}

// absent are the expected ranks that said nothing in this round, by rank.
func (j *Job) absent(now time.Time) []Blame {
	var out []Blame
	for r, host := range j.expect {
		if _, ok := j.ranks[r]; !ok {
			out = append(out, Blame{Rank: r, Host: host, Absent: true, Silent: now.Sub(j.since)})
		}
	}
	return out
}

// frozenAmong says whether blame found ranks frozen whole (their heartbeat stopped while others' went on).
func frozenAmong(bs []Blame) bool {
	return len(bs) > 0 && bs[0].Silent > 0
}

// blame orders a hung round's ranks, the ones to name first: those frozen whole, when others are not (the longest
// silent first); else, with no heartbeat to tell them apart (all silent, or none), the least step, then the
// earliest to stop, which in synchronous training is a hint (a rank that hangs inside a step leaves every other at
// that step).
func blame(all []Blame) []Blame {
	frozen := slices.DeleteFunc(slices.Clone(all), func(b Blame) bool { return b.Silent < FrozenAfter })
	if len(frozen) > 0 && len(frozen) < len(all) {
		slices.SortFunc(frozen, func(a, b Blame) int { return cmp.Or(cmp.Compare(b.Silent, a.Silent), cmp.Compare(a.Rank, b.Rank)) })
		return frozen[:min(len(frozen), maxBlamed)]
	}
	for i := range all {
		all[i].Silent = 0
	}
	slices.SortFunc(all, func(a, b Blame) int {
		return cmp.Or(cmp.Compare(a.Step, b.Step), a.Advanced.Compare(b.Advanced), cmp.Compare(a.Rank, b.Rank))
	})
	return all[:min(len(all), maxBlamed)]
}
