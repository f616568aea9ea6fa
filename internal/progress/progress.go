// Package progress is what the ranks of a job say of their training (elastic_training.progress: a step and the
// steps in all) and what the sidecars judge of it (docs/hangs.md): a pod's sidecar keeps its own ranks' last
// steps (Local) and reports them to the serving sidecar, which keeps the job's (Job) and finds a hang (no rank has
// advanced for the hang timeout) and stragglers (ranks much slower than the others). Pure: times are arguments.
//
// Clocks: a report says how long ago each rank last advanced (Age), not when, so that the serving sidecar places
// every rank on its own clock, whatever the nodes' clocks say.
package progress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Bounds on what a trainer or a peer may make a sidecar hold.
const (
	// MaxRanks is the most ranks one pod reports (an 8-GPU node has 8; a CPU pod may run more processes).
	MaxRanks = 1024
	// MaxUpdate is the longest update a trainer sends: "et1 <rank> <step> <total> <pid>".
	MaxUpdate = 96
	// MaxReport is the longest report of a pod: MaxRanks ranks of about 90 bytes.
	MaxReport = 128 << 10
	maxRank   = 1 << 24
)

// Update is one rank's word: it finished step Step of Total (0: unknown). Pid is the process that says it (0:
// unknown, a shell's line): a new process is a new start even at the step its predecessor last said, which a
// worker restarted from a checkpoint of that step is.
type Update struct {
	Rank        int
	Step, Total int64
	Pid         int
}

// ParseUpdate reads "et1 <rank> <step> [<total> [<pid>]]" (a trailing newline allowed): the datagram that
// elastic_training.progress sends to its pod's sidecar, and what a shell writes to it.
func ParseUpdate(b []byte) (Update, error) {
	if len(b) > MaxUpdate {
		return Update{}, fmt.Errorf("progress update: %d bytes, want at most %d", len(b), MaxUpdate)
	}
	f := bytes.Fields(b)
	if len(f) < 3 || len(f) > 5 || string(f[0]) != "et1" {
		return Update{}, errors.New(`progress update: want "et1 <rank> <step> [<total> [<pid>]]"`)
	}
	var u Update
	rank, err := strconv.Atoi(string(f[1]))
	if err != nil || rank < 0 || rank >= maxRank {
		return Update{}, fmt.Errorf("progress update: rank %.20q: want 0 to %d", f[1], maxRank-1)
	}
	u.Rank = rank
	if u.Step, err = strconv.ParseInt(string(f[2]), 10, 64); err != nil || u.Step < 0 {
		return Update{}, fmt.Errorf("progress update: step %.20q: want a count", f[2])
	}
	if len(f) >= 4 {
		if u.Total, err = strconv.ParseInt(string(f[3]), 10, 64); err != nil || u.Total < 0 {
			return Update{}, fmt.Errorf("progress update: total %.20q: want a count", f[3])
		}
	}
	if len(f) == 5 {
		if u.Pid, err = strconv.Atoi(string(f[4])); err != nil || u.Pid <= 0 || u.Pid >= 1<<31 {
			return Update{}, fmt.Errorf("progress update: pid %.20q: want a process id", f[4])
		}
	}
	return u, nil
}

// rank is one rank as a sidecar follows it.
type rank struct {
	step, total int64
	advanced    time.Time     // when step last grew (or the rank began again)
	stepTime    time.Duration // a smoothed time between advances; 0 until two
	heard       time.Time     // its last word: elastic_training.progress says its last step again every second
	pid         int           // the process that said it (0: unknown)
}

func (r *rank) observe(u Update, now time.Time) bool {
	defer func() { r.heard = now }()
	switch {
	case r.advanced.IsZero() || u.Step < r.step || u.Pid != r.pid:
		// First word, or its worker began again (a new round): a new process may resume at the step its
		// predecessor said last, and is not that one's heartbeat.
		*r = rank{step: u.Step, total: u.Total, advanced: now, pid: u.Pid}
	case u.Step > r.step:
		per := now.Sub(r.advanced) / time.Duration(min(u.Step-r.step, 1<<20))
		if r.stepTime == 0 {
			r.stepTime = per
		} else {
			r.stepTime = (3*r.stepTime + per) / 4
		}
		r.step, r.advanced = u.Step, now
		r.total = cmpOr(u.Total, r.total)
	default:
		if u.Total == 0 || u.Total == r.total {
			// The same step again: the rank's process is alive (its heartbeat), which a rank frozen whole is not.
			return now.Sub(r.heard) >= time.Second/2
		}
		r.total = u.Total
	}
	return true
}

func cmpOr(a, b int64) int64 {
	if a != 0 {
		return a
	}
	return b
}

// Local is a pod's ranks as its sidecar hears them.
type Local struct {
	ranks   map[int]*rank
	changed bool
}

// NewLocal returns a Local that has heard no rank.
func NewLocal() *Local { return &Local{ranks: map[int]*rank{}} }

// Observe takes an update heard at now; an update of a rank past MaxRanks others is dropped (false).
func (l *Local) Observe(u Update, now time.Time) bool {
	r := l.ranks[u.Rank]
	if r == nil {
		if len(l.ranks) >= MaxRanks {
			return false
		}
		r = &rank{}
		l.ranks[u.Rank] = r
	}
	if r.observe(u, now) {
		l.changed = true
	}
	return true
}

// Changed says whether anything changed since the last Report.
func (l *Local) Changed() bool { return l.changed }

// Report is a pod's ranks for the serving sidecar, as of now.
func (l *Local) Report(now time.Time) Report {
	l.changed = false
	rep := Report{Ranks: make([]RankReport, 0, len(l.ranks))}
	for n, r := range l.ranks {
		rep.Ranks = append(rep.Ranks, RankReport{Rank: n, Step: r.step, Total: r.total,
			AgeMs: now.Sub(r.advanced).Milliseconds(), StepMs: r.stepTime.Milliseconds(), SilentMs: now.Sub(r.heard).Milliseconds()})
	}
	slices.SortFunc(rep.Ranks, func(a, b RankReport) int { return a.Rank - b.Rank })
	return rep
}

// Report is what a pod's sidecar tells the serving sidecar of its ranks.
type Report struct {
	Ranks []RankReport `json:"ranks"`
}

// RankReport is one rank: its step, the steps in all (0: unknown), how long ago it last advanced, its usual time
// per step (0: not known yet) and how long ago it last said anything (its heartbeat), in milliseconds.
type RankReport struct {
	Rank     int   `json:"rank"`
	Step     int64 `json:"step"`
	Total    int64 `json:"total,omitempty"`
	AgeMs    int64 `json:"age_ms"`
	StepMs   int64 `json:"step_ms,omitempty"`
	SilentMs int64 `json:"silent_ms,omitempty"`
}

// Encode is the report's value in the store.
func (r Report) Encode() []byte {
	b, _ := json.Marshal(r)
	return b
}

// ParseReport reads a report strictly: bounded, no unknown fields, each rank once, no negative figure.
func ParseReport(b []byte) (Report, error) {
	if len(b) > MaxReport {
		return Report{}, fmt.Errorf("progress report: %d bytes, want at most %d", len(b), MaxReport)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	var r Report
	if err := d.Decode(&r); err != nil {
		return Report{}, fmt.Errorf("progress report: %w", err)
	}
	if d.More() {
		return Report{}, errors.New("progress report: data after the report")
	}
	if len(r.Ranks) > MaxRanks {
		return Report{}, fmt.Errorf("progress report: %d ranks, want at most %d", len(r.Ranks), MaxRanks)
	}
	seen := make(map[int]bool, len(r.Ranks))
	for _, x := range r.Ranks {
		if x.Rank < 0 || x.Rank >= maxRank || x.Step < 0 || x.Total < 0 || x.AgeMs < 0 || x.StepMs < 0 || x.SilentMs < 0 {
			return Report{}, fmt.Errorf("progress report: rank %d: a figure out of range", x.Rank)
		}
		if seen[x.Rank] {
			return Report{}, fmt.Errorf("progress report: rank %d twice", x.Rank)
		}
		seen[x.Rank] = true
	}
	return r, nil
}
