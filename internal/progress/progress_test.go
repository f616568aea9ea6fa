package progress

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseUpdate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Update
		err  string
	}{
		{"et1 0 12", Update{Rank: 0, Step: 12}, ""},
		{"et1 3 12 1000\n", Update{Rank: 3, Step: 12, Total: 1000}, ""},
		{"et1 3 12 1000 9", Update{Rank: 3, Step: 12, Total: 1000, Pid: 9}, ""},
		{"et1 3 12 0 77\n", Update{Rank: 3, Step: 12, Pid: 77}, ""},
		{"et1 3 12 1000 9 1", Update{}, "want"},
		{"et1 3 12 1000 0", Update{}, "pid"},
		{"et1 3 12 1000 2147483648", Update{}, "pid"},
		{"et1 3 12 1000 x", Update{}, "pid"},
		{"et2 3 12", Update{}, "want"},
		{"et1 -1 12", Update{}, "rank"},
		{"et1 16777216 1", Update{}, "rank"},
		{"et1 0 -4", Update{}, "step"},
		{"et1 0 x", Update{}, "step"},
		{"et1 0 1 -1", Update{}, "total"},
		{"et1 0 99999999999999999999", Update{}, "step"},
		{"et1 0 1 " + strings.Repeat("1", 96), Update{}, "bytes"},
		{"", Update{}, "want"},
	} {
		got, err := ParseUpdate([]byte(tc.in))
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
}

func TestLocalReport(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := NewLocal()
	require.False(t, l.Changed())
	l.Observe(Update{Rank: 1, Step: 1, Total: 100}, t0)
	l.Observe(Update{Rank: 0, Step: 1}, t0)
	require.True(t, l.Changed())
	l.Observe(Update{Rank: 1, Step: 2}, t0.Add(400*time.Millisecond))
	l.Observe(Update{Rank: 1, Step: 4}, t0.Add(1200*time.Millisecond)) // two steps at once: 400 ms each
	rep := l.Report(t0.Add(1500 * time.Millisecond))
	require.False(t, l.Changed())
	assert.Equal(t, Report{Ranks: []RankReport{
		{Rank: 0, Step: 1, AgeMs: 1500, SilentMs: 1500},
		{Rank: 1, Step: 4, Total: 100, AgeMs: 300, StepMs: 400, SilentMs: 300},
	}}, rep)
	// The same step again within half a second changes nothing; later it is the rank's heartbeat (its process is
	// alive), which the report carries; a lower step is the rank's worker begun again.
	l.Observe(Update{Rank: 1, Step: 4}, t0.Add(1600*time.Millisecond))
	require.False(t, l.Changed())
	l.Observe(Update{Rank: 1, Step: 4}, t0.Add(2600*time.Millisecond))
	require.True(t, l.Changed())
	assert.Equal(t, RankReport{Rank: 1, Step: 4, Total: 100, AgeMs: 1500, StepMs: 400, SilentMs: 100}, l.Report(t0.Add(2700 * time.Millisecond)).Ranks[1])
	l.Observe(Update{Rank: 1, Step: 0}, t0.Add(3*time.Second))
	assert.Equal(t, RankReport{Rank: 1, Step: 0, AgeMs: 0}, l.Report(t0.Add(3 * time.Second)).Ranks[1])

	// A worker restarted from a checkpoint of the step its predecessor said last: a new process, so a new start
	// (it advanced now), not the old one's heartbeat; its own same step again later is.
	l.Observe(Update{Rank: 0, Step: 7, Pid: 40}, t0.Add(4*time.Second))
	l.Observe(Update{Rank: 0, Step: 7, Pid: 41}, t0.Add(9*time.Second))
	assert.Equal(t, RankReport{Rank: 0, Step: 7, AgeMs: 1000, SilentMs: 1000}, l.Report(t0.Add(10 * time.Second)).Ranks[0])
	l.Observe(Update{Rank: 0, Step: 7, Pid: 41}, t0.Add(11*time.Second))
	assert.Equal(t, RankReport{Rank: 0, Step: 7, AgeMs: 3000, SilentMs: 1000}, l.Report(t0.Add(12 * time.Second)).Ranks[0])

	back, err := ParseReport(rep.Encode())
	require.NoError(t, err)
	assert.Equal(t, rep, back)
}

func TestLocalBoundsRanks(t *testing.T) {
	l := NewLocal()
	for i := range MaxRanks {
		require.True(t, l.Observe(Update{Rank: i, Step: 1}, time.Unix(0, 0)))
	}
	require.False(t, l.Observe(Update{Rank: MaxRanks, Step: 1}, time.Unix(0, 0)))
	require.True(t, l.Observe(Update{Rank: 0, Step: 2}, time.Unix(1, 0)), "a rank it holds still advances")
	require.LessOrEqual(t, len(l.Report(time.Unix(2, 0)).Encode()), MaxReport)
}

func TestParseReportRefuses(t *testing.T) {
	for _, in := range []string{
		`{"ranks":[{"rank":0,"step":1,"age_ms":0}],"x":1}`,
		`{"ranks":[{"rank":0,"step":1,"age_ms":0},{"rank":0,"step":2,"age_ms":0}]}`,
		`{"ranks":[{"rank":0,"step":-1,"age_ms":0}]}`,
		`{"ranks":[{"rank":0,"step":1,"age_ms":-5}]}`,
		`{"ranks":[]} {}`,
		`[`,
		"{\"ranks\":[" + strings.Repeat(`{"rank":0,"step":1,"age_ms":0},`, 5000) + "]}",
	} {
		_, err := ParseReport([]byte(in))
		require.Error(t, err, "%.80s", in)
	}
}

// report is a host's report of ranks at step, each last advanced age ago, at stepMs a step.
func report(step, ageMs, stepMs int64, ranks ...int) Report {
	var r Report
	for _, n := range ranks {
		r.Ranks = append(r.Ranks, RankReport{Rank: n, Step: step, Total: 1000, AgeMs: ageMs, StepMs: stepMs})
	}
	return r
}

func TestJudge(t *testing.T) {
	formed := time.Unix(1000, 0)
	now := formed.Add(time.Minute)
	for _, tc := range []struct {
		name    string
		reports map[string]Report
		timeout time.Duration
		at      time.Time
		hung    bool
		stopped []int
		strag   []int
		step    int64
	}{
		{name: "nobody said anything: never hung", at: now.Add(time.Hour)},
		{name: "training", reports: map[string]Report{"a": report(50, 100, 200, 0, 1), "b": report(50, 150, 200, 2, 3)}, at: now, step: 50},
		{name: "no rank advanced for the minimum: hung, the laggard first",
			reports: map[string]Report{"a": report(50, 100, 200, 0, 1), "b": report(49, 300, 200, 2, 3)}, at: now.Add(MinTimeout),
			hung: true, stopped: []int{2, 3, 0, 1}, step: 49},
		{name: "slow steps: ten of them before a hang",
			reports: map[string]Report{"a": report(5, 0, 20_000, 0)}, at: now.Add(150 * time.Second), step: 5},
		{name: "slow steps, past ten", reports: map[string]Report{"a": report(5, 0, 20_000, 0)}, at: now.Add(201 * time.Second),
			hung: true, stopped: []int{0}, step: 5},
		{name: "a set timeout", reports: map[string]Report{"a": report(5, 0, 100, 0)}, timeout: 5 * time.Second, at: now.Add(5 * time.Second),
			hung: true, stopped: []int{0}, step: 5},
		{name: "a straggler: slow but advancing",
			reports: map[string]Report{"a": report(50, 100, 200, 0, 1), "b": report(48, 100, 900, 2)}, at: now, strag: []int{2}, step: 48},
		{name: "ranks of an earlier round are not heard",
			reports: map[string]Report{"a": report(50, 2*60*1000, 200, 0)}, at: now.Add(time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := NewJob(formed)
			for h, r := range tc.reports {
				j.Update(h, r, now)
			}
			v := j.Judge(tc.at, tc.timeout)
			assert.Equal(t, tc.hung, v.Hung, "%+v", v)
			assert.Equal(t, tc.step, max(v.Step, 0))
			var stopped, strag []int
			for _, b := range v.Stopped {
				stopped = append(stopped, b.Rank)
			}
			for _, s := range v.Stragglers {
				strag = append(strag, s.Rank)
			}
			assert.Equal(t, tc.stopped, stopped)
			assert.Equal(t, tc.strag, strag)
		})
	}
}

func TestJobReplacesAHostsReport(t *testing.T) {
	formed := time.Unix(1000, 0)
	j := NewJob(formed)
	j.Update("a", report(5, 0, 100, 0, 1), formed.Add(time.Second))
	j.Update("b", report(5, 0, 100, 2), formed.Add(time.Second))
	j.Update("a", report(6, 0, 100, 0), formed.Add(2*time.Second))
	require.Equal(t, 2, j.Judge(formed.Add(2*time.Second), 0).Ranks, "rank 1 is no longer a's")
	j.Update("b", report(6, 0, 100, 0, 2), formed.Add(3*time.Second)) // rank 0 moved to b (a new round's ranks)
	j.Forget("a")
	require.Equal(t, 2, j.Judge(formed.Add(3*time.Second), 0).Ranks, "a's forgetting leaves b's rank 0")
	j.Forget("b")
	require.Zero(t, j.Judge(formed.Add(3*time.Second), 0).Ranks)
}

func TestVerdictRateAndETA(t *testing.T) {
	v := Verdict{Step: 100, Total: 1100, StepTime: 250 * time.Millisecond}
	assert.InDelta(t, 4.0, v.Rate(), 1e-9)
	assert.Equal(t, 250*time.Second, v.ETA())
	assert.Zero(t, Verdict{Step: 5}.ETA())
}

func FuzzParseUpdate(f *testing.F) {
	f.Add([]byte("et1 0 12 100"))
	f.Add([]byte("et1 3 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := ParseUpdate(b)
		if err == nil {
			require.GreaterOrEqual(t, u.Step, int64(0))
			require.GreaterOrEqual(t, u.Rank, 0)
		}
	})
}

func FuzzParseReport(f *testing.F) {
	f.Add(report(5, 10, 100, 0, 1).Encode())
	f.Add([]byte(`{"ranks":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseReport(b)
		if err != nil {
			return
		}
		back, err := ParseReport(r.Encode())
		require.NoError(t, err, "a report it took encodes to one it takes")
		require.Equal(t, r, back)
		j := NewJob(time.Unix(0, 0))
		j.Update("h", r, time.Unix(100, 0))
		j.Judge(time.Unix(200, 0), 0)
	})
}

// Of a hung round, the rank frozen whole is named, with its silence: its heartbeat stopped while the others, blocked
// in their next collective at the same step, kept saying it; without heartbeats to tell them apart (every rank
// silent) the step rule names them, with no silence.
func TestJudgeBlamesTheFrozenRank(t *testing.T) {
	formed := time.Unix(1000, 0)
	j := NewJob(formed)
	at := formed.Add(10 * time.Second)
	// b's only rank froze at step 30: its sidecar's last report came then, and none after (nothing changed).
	j.Update("b", Report{Ranks: []RankReport{{Rank: 1, Step: 30, AgeMs: 100, StepMs: 200}}}, at)
	// a's rank waits in the all_reduce of step 31, at step 30 too, and its heartbeat goes on.
	later := at.Add(MinTimeout + 2*time.Second)
	j.Update("a", Report{Ranks: []RankReport{{Rank: 0, Step: 30, AgeMs: (MinTimeout + 2*time.Second).Milliseconds(), StepMs: 200, SilentMs: 300}}}, later)
	v := j.Judge(later, 0)
	require.True(t, v.Hung)
	require.Len(t, v.Stopped, 1)
	assert.Equal(t, "rank 1 (b) at step 30, frozen (silent 1m2s)", v.Stopped[0].String())

	// No heartbeat from anyone (a trainer of an older package, a shell loop): the hint of the steps.
	j = NewJob(formed)
	j.Update("b", Report{Ranks: []RankReport{{Rank: 1, Step: 30, AgeMs: 100}}}, at)
	j.Update("a", Report{Ranks: []RankReport{{Rank: 0, Step: 29, AgeMs: 100}}}, at)
	v = j.Judge(later, 0)
	require.True(t, v.Hung)
	assert.Equal(t, "rank 0 (a) at step 29, rank 1 (b) at step 30", Join(v.Stopped))
}

// A rank frozen before its first step of a round said nothing in it: the others, that did and then wait for it in
// their next collective (heartbeating), would otherwise be the ones named. Where every rank has reported in an
// earlier round the absent rank is named; in a program whose rank 0 alone calls progress, the absent are no hint.
func TestJudgeBlamesTheAbsentRank(t *testing.T) {
	formed := time.Unix(1000, 0)
	later := formed.Add(MinTimeout + 5*time.Second)
	judge := func(blameAbsent bool) Verdict {
		j := NewJob(formed)
		j.Expect([]string{"a", "b", "c"})
		j.BlameAbsent = blameAbsent
		j.Update("a", Report{Ranks: []RankReport{{Rank: 0, Step: 5, AgeMs: (MinTimeout + 3*time.Second).Milliseconds(), SilentMs: 400}}}, later)
		j.Update("c", Report{Ranks: []RankReport{{Rank: 2, Step: 5, AgeMs: (MinTimeout + 3*time.Second).Milliseconds(), SilentMs: 700}}}, later)
		require.False(t, j.Complete())
		return j.Judge(later, 0)
	}
	v := judge(true)
	require.True(t, v.Hung)
	require.Len(t, v.Stopped, 1)
	assert.Equal(t, "rank 1 (b), no step said in this round (1m5s since it formed)", v.Stopped[0].String())
	v = judge(false)
	require.True(t, v.Hung)
	assert.Equal(t, "rank 0 (a) at step 5", v.Stopped[0].String(), "the step rule, as without Expect")

	// Every rank reported: Complete, and nothing is absent.
	j := NewJob(formed)
	j.Expect([]string{"a", "a"})
	j.Update("a", Report{Ranks: []RankReport{{Rank: 0, Step: 1}, {Rank: 1, Step: 1}}}, formed.Add(time.Second))
	require.True(t, j.Complete())
}
