package c10drounds

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/progress"
	"github.com/elastic-training/elastic-training/internal/rdzv"
	"github.com/elastic-training/elastic-training/internal/tcpstore"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// fixture is Rounds on a real (in-process) c10d store, with a membership the
// test edits.
type fixture struct {
	*Rounds
	store   *tcpstore.Server
	members map[string]membership.Member
	rounds  []rdzv.Round // as OnState told them
	states  []State
	log     *testenv.SyncBuffer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	st, err := tcpstore.New(tcpstore.Config{})
	require.NoError(t, err)
	f := &fixture{store: st, members: map[string]membership.Member{}, log: &testenv.SyncBuffer{}}
	f.Rounds = New(Config{Store: st, Log: slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Member: func(h string) (membership.Member, bool) { m, ok := f.members[h]; return m, ok },
		Members: func() []membership.Member {
			var ms []membership.Member
			for _, m := range f.members {
				ms = append(ms, m)
			}
			return ms
		},
		OnState: func(_ string, s State) {
			if n := len(f.rounds); s.Round.Number > 0 && (n == 0 || f.rounds[n-1].Number != s.Round.Number) {
				f.rounds = append(f.rounds, s.Round)
			}
			f.states = append(f.states, s)
		}})
	t.Cleanup(f.Stop)
	return f
}

func host(i int) string { return fmt.Sprintf("job-worker-%d.job.ns.svc", i) }

// join registers worker i (as the membership's watch would tell).
func (f *fixture) join(is ...int) {
	var hs []string
	for _, i := range is {
		f.members[host(i)] = membership.Member{Host: host(i), Slots: 1, Group: "worker", Index: i}
		hs = append(hs, host(i))
	}
	f.MembersChanged(hs, nil)
}

func (f *fixture) leave(i int) {
	delete(f.members, host(i))
	f.MembersChanged(nil, []string{host(i)})
}

// ready is worker i's agent asking for the next round, as the handler writes it.
func (f *fixture) ready(run, settings string, is ...int) {
	for _, i := range is {
		f.C10dWrite(ReadyKey(run, host(i)), []byte(settings))
	}
}

func (f *fixture) get(key string) string {
	v, ok := f.store.Get(key)
	if !ok {
		return "<none>"
	}
	return string(v)
}

func TestRounds(t *testing.T) {
	const elastic = `{"min":2,"max":3,"last_call":0}`
	f := newFixture(t)
	f.join(1, 0)
	f.ready("r", elastic, 1)
	require.Equal(t, "round=0 waiting=1", f.get(StateKey("r")))
	f.ready("r", elastic, 0)
	require.Equal(t, "1 0 2", f.get(RankKey("r", host(0))), "ranks follow the index")
	require.Equal(t, "1 1 2", f.get(RankKey("r", host(1))))
	require.Equal(t, "round=1 waiting=0", f.get(StateKey("r")))

	// A scale-up: the newcomer is waiting, the round's agents restart and ask again.
	f.join(2)
	f.ready("r", elastic, 2)
	require.Equal(t, "round=1 waiting=1", f.get(StateKey("r")))
	require.NoError(t, f.store.Set(RoundPrefix("r", 1)+"store/MASTER_ADDR", []byte(host(0))), "the round's store, as the agents write it")
	f.ready("r", elastic, 0, 1)
	require.Equal(t, "round=2 waiting=0", f.get(StateKey("r")))
	for i := range 3 {
		require.Equal(t, fmt.Sprintf("2 %d 3", i), f.get(RankKey("r", host(i))))
	}
	require.Equal(t, "<none>", f.get(RoundPrefix("r", 1)+"store/MASTER_ADDR"), "round 1's store is dropped once round 2 forms")

	// A node lost: its member leaves, the survivors are told one node waits, and re-form without it.
	f.leave(1)
	require.Equal(t, "round=2 waiting=1", f.get(StateKey("r")))
	f.ready("r", elastic, 2, 0)
	require.Equal(t, "3 0 2", f.get(RankKey("r", host(0))))
	require.Equal(t, "3 1 2", f.get(RankKey("r", host(2))))
	require.Len(t, f.rounds, 3)
	require.Contains(t, f.log.String(), "elastic-training backend: round 3 of run r: 2 nodes", "at debug level")

	// A scale-down: the leaving pod's preStop hook says so before its registration ends.
	f.join(1)
	f.ready("r", elastic, 1)
	f.ready("r", elastic, 0, 2)
	require.Equal(t, "4 2 3", f.get(RankKey("r", host(2))))
	f.C10dWrite(Prefix+"r/leave/"+host(2), []byte("1"))
	require.Equal(t, "round=4 waiting=1", f.get(StateKey("r")))
	require.Equal(t, State{Round: f.rounds[3], Waiting: 1}, f.states[len(f.states)-1])
	f.ready("r", elastic, 2) // its agent restarts its workers before its SIGTERM: not heard
	f.ready("r", elastic, 0, 1)
	require.Equal(t, "5 1 2", f.get(RankKey("r", host(1))))
	// Its pod's registration ends; a replacement of the same name registers and is heard again.
	f.leave(2)
	f.join(2)
	f.ready("r", elastic, 2)
	require.Equal(t, "round=5 waiting=1", f.get(StateKey("r")))
	f.ready("r", elastic, 0, 1)
	require.Equal(t, "6 2 3", f.get(RankKey("r", host(2))))

	// Closed: nothing forms after it, and an agent waiting for a round (or asking as it closes) is told so.
	f.ready("r", elastic, 2)
	f.C10dWrite(ClosedKey("r"), []byte("1"))
	require.True(t, f.states[len(f.states)-1].Closed)
	require.Equal(t, "closed", f.get(RankKey("r", host(2))))
	f.ready("r", elastic, 0, 1)
	require.Len(t, f.rounds, 6)
	require.Equal(t, "closed", f.get(RankKey("r", host(0))))
	f.ready("r", elastic, 9) // not a member: no key for it
	require.Equal(t, "<none>", f.get(RankKey("r", host(9))))
}

// TestAskedAgain: an agent that lost the connection it asked on asks again
// with the same request id over a new one, and deletes its rank first. A
// round that took it for that request is answered again, not taken for a
// request of the next one: the round's other agents wait for it in their
// rendezvous (seen on the cluster when the rendezvous pod was replaced: an
// agent's first ask reached the new store before its pod registered there,
// the round formed with it, and its second ask deleted the rank; the other
// agent of the round waited 60 s in torch's _assign_worker_ranks and exited).
func TestAskedAgain(t *testing.T) {
	ready := func(ask string) []byte { return fmt.Appendf(nil, `{"min":2,"max":2,"last_call":0,"ask":%q}`, ask) }
	f := newFixture(t)
	f.join(0)
	f.C10dWrite(ReadyKey("r", host(1)), ready("a1")) // before its pod is a member; then its connection breaks
	f.C10dWrite(ReadyKey("r", host(0)), ready("a0"))
	require.Equal(t, "<none>", f.get(RankKey("r", host(0))))
	f.join(1)
	require.Equal(t, "1 0 2 a0", f.get(RankKey("r", host(0))), "the rank names the request it answers")
	require.Equal(t, "1 1 2 a1", f.get(RankKey("r", host(1))))

	f.store.DeletePrefix(RankKey("r", host(1)))
	f.C10dWrite(ReadyKey("r", host(1)), ready("a1"))
	require.Equal(t, "1 1 2 a1", f.get(RankKey("r", host(1))), "answered again")
	require.Equal(t, "round=1 waiting=0", f.get(StateKey("r")), "not a request for round 2")

	f.C10dWrite(ReadyKey("r", host(1)), ready("b1")) // a new request: its workers failed, say
	require.Equal(t, "round=1 waiting=1", f.get(StateKey("r")))
	f.C10dWrite(ReadyKey("r", host(0)), ready("b0"))
	require.Equal(t, "2 1 2 b1", f.get(RankKey("r", host(1))))
	f.C10dWrite(ReadyKey("r", host(0)), ready("a0")) // an older request of round 1's is a new one
	require.Equal(t, "round=2 waiting=1", f.get(StateKey("r")))

	// An agent of before the request id reads three fields, and each of its asks is a new request.
	f.ready("r", `{"min":2,"max":2,"last_call":0}`, 1)
	require.Equal(t, "3 0 2 a0", f.get(RankKey("r", host(0))))
	require.Equal(t, "3 1 2", f.get(RankKey("r", host(1))))
	f.ready("r", `{"min":2,"max":2,"last_call":0}`, 1)
	require.Equal(t, "round=3 waiting=1", f.get(StateKey("r")))
}

// TestDone: an agent that finished leaves its round quietly: the others are
// told no node waits when its pod then goes, and the next round does not
// wait for it. After a preStop's leave, done changes nothing.
func TestDone(t *testing.T) {
	const elastic = `{"min":1,"max":3,"last_call":60}`
	f := newFixture(t)
	f.join(0, 1, 2)
	f.ready("r", elastic, 0, 1, 2)
	require.Equal(t, "round=1 waiting=0", f.get(StateKey("r")))
	f.C10dWrite(DoneKey("r", host(1)), []byte("1"))
	require.Equal(t, 1, f.states[len(f.states)-1].Ended, "the view is told one agent of round 1 ended its run")
	f.leave(1)
	require.Equal(t, "round=1 waiting=0", f.get(StateKey("r")), "host 1 finished: rank 0 saving a checkpoint must not restart")
	f.ready("r", elastic, 2)
	require.Equal(t, "round=1 waiting=1", f.get(StateKey("r")))
	f.ready("r", elastic, 0)
	require.Equal(t, "2 1 2", f.get(RankKey("r", host(2))), "round 2 without the finished one")

	f.C10dWrite(Prefix+"r/leave/"+host(2), []byte("1"))
	f.C10dWrite(DoneKey("r", host(2)), []byte("1")) // its SIGTERM after the preStop: still a loss
	require.Equal(t, "round=2 waiting=1", f.get(StateKey("r")))
}

// TestLastCall: with fewer than max ready, the round forms a last call after
// the last agent became ready (a real timer, bounded by the test's wait).
func TestLastCall(t *testing.T) {
	f := newFixture(t)
	f.join(0, 1, 2)
	f.ready("r", `{"min":1,"max":3,"last_call":0.2}`, 0, 1)
	require.Equal(t, "<none>", f.get(RankKey("r", host(0))))
	testenv.Eventually(t, 10*time.Second, "round 1 after the last call", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.rounds) != 1 || len(f.rounds[0].Participants) != 2 {
			return fmt.Errorf("rounds %v", f.rounds)
		}
		return nil
	})
}

// TestRefused: writes that are not a valid request change nothing and are
// logged, a few lines for many.
func TestRefused(t *testing.T) {
	f := newFixture(t)
	f.refused = rate.NewLimiter(rate.Inf, 0) // every refusal logged, to check each message
	f.join(0)
	for _, tc := range []struct{ key, value, err string }{
		{ReadyKey("r", host(0)), `{"min":2,"max":1}`, "min (2) <= max (1)"},
		{ReadyKey("r", host(0)), `{"min":1,"max":2000000}`, "max <= 1048576"},
		{ReadyKey("r", host(0)), `{"min":1,"max":1,"last_call":-1}`, "last_call"},
		{ReadyKey("r", host(0)), `not json`, "ready value"},
		{ReadyKey("r", host(0)), strings.Repeat(" ", 2000), "at most 1024"},
		{ReadyKey("r", host(0)), `{"min":1,"max":1,"ask":"a b"}`, "ask: want at most 64 letters"},
		{ReadyKey("r", host(0)), `{"min":1,"max":1,"ask":"` + strings.Repeat("a", 65) + `"}`, "ask: want at most 64 letters"},
		{ReadyKey("r", "bad_host"), `{"min":1,"max":1}`, "not allowed"},
		{Prefix + "/ready/" + host(0), `{"min":1,"max":1}`, "run id"},
		{Prefix + strings.Repeat("r", 200) + "/ready/" + host(0), `{"min":1,"max":1}`, "run id"},
	} {
		f.C10dWrite(tc.key, []byte(tc.value))
		require.Contains(t, f.log.String(), tc.err, "%s = %s", tc.key, tc.value)
	}
	require.Empty(t, f.runs)
	f.C10dWrite(RoundPrefix("r", 1)+"store/x", []byte("1"))
	require.NotContains(t, f.log.String(), "store/x", "a round's store is not the sidecar's business")

	for i := range MaxRuns + 2 {
		f.ready(fmt.Sprint("run-", i), `{"min":2,"max":2}`, 0)
	}
	require.Len(t, f.runs, MaxRuns)
	require.Contains(t, f.log.String(), "at most 4 runs")

	// Agents of hosts that are not members wait for their registration, a bounded number of them: past it the
	// oldest is forgotten, so a real agent that asks before its pod registered is still heard.
	for i := range rdzv.MaxUnregistered + 10 {
		f.C10dWrite(ReadyKey("run-0", fmt.Sprintf("stranger-%d", i)), []byte(`{"min":2,"max":2}`))
	}
	require.Equal(t, rdzv.MaxUnregistered, f.runs["run-0"].core.Unregistered())
	require.Contains(t, f.log.String(), "forgot the one of stranger-0, which asked first")
	f.C10dWrite(ReadyKey("run-0", host(1)), []byte(`{"min":2,"max":2}`))
	f.join(1)
	require.Equal(t, "1 1 2", f.get(RankKey("run-0", host(1))), "the agent that asked before its registration is in the round")
}

// TestStickyBounds: what a client that is not the sidecar, or not a member, writes does not stay: a run takes a
// member's settings, a run no member takes part in makes room for a new one, an unregistered ask expires, and the
// state key is the sidecar's.
func TestStickyBounds(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	f := newFixture(t)
	f.cfg.Now = func() time.Time { return now }
	f.join(0, 1)

	// A host that is no member begins the run with settings of its own; the members' settings are the run's.
	f.C10dWrite(ReadyKey("r", "stranger"), []byte(`{"min":1,"max":1,"last_call":0}`))
	f.ready("r", `{"min":2,"max":2,"last_call":0}`, 0)
	require.Equal(t, "<none>", f.get(RankKey("r", host(0))), "no round of 1")
	f.ready("r", `{"min":2,"max":2,"last_call":0}`, 1)
	require.Equal(t, "1 0 2", f.get(RankKey("r", host(0))))

	// A forged state key is written back.
	require.NoError(t, f.store.Set(StateKey("r"), []byte("round=1 waiting=7")))
	f.C10dWrite(StateKey("r"), []byte("round=1 waiting=7"))
	require.Equal(t, "round=1 waiting=0", f.get(StateKey("r")))

	// The stranger's ask expires.
	now = now.Add(unregisteredTTL + expireEvery)
	f.C10dWrite(ReadyKey("r", "stranger-2"), []byte(`{"min":1,"max":1,"last_call":0}`))
	require.Equal(t, 1, f.runs["r"].core.Unregistered(), "only the new stranger waits")

	// Runs no member takes part in (strangers' runs) make room for a new one once idle.
	for i := range MaxRuns - 1 {
		f.C10dWrite(ReadyKey(fmt.Sprint("forged-", i), "stranger"), []byte(`{"min":1,"max":1,"last_call":0}`))
	}
	require.Len(t, f.runs, MaxRuns)
	f.ready("next", `{"min":2,"max":2,"last_call":0}`, 0)
	require.NotContains(t, f.runs, "next", "the strangers' runs are not idle for long enough yet")
	now = now.Add(idleRun)
	require.NoError(t, f.store.Set(RoundPrefix("forged-0", 1)+"store/x", []byte("1")))
	f.ready("next", `{"min":2,"max":2,"last_call":0}`, 0)
	require.Contains(t, f.runs, "next")
	require.Contains(t, f.runs, "r", "a run members take part in stays")
	require.Equal(t, "<none>", f.get(RoundPrefix("forged-0", 1)+"store/x"), "a forgotten run's keys are dropped")
	require.Contains(t, f.log.String(), "forgot a run no member took part in")
}

// FuzzWrite: no write makes Rounds panic or follow more runs than MaxRuns,
// and every rank it writes is within its round.
func FuzzWrite(f *testing.F) {
	f.Add("r/ready/"+host(0), []byte(`{"min":1,"max":2,"last_call":0}`))
	f.Add("r/closed", []byte("1"))
	f.Add("r/done/"+host(1), []byte("1"))
	f.Add("r/leave/"+host(0), []byte("1"))
	f.Add("r/ready/a", []byte(`{"min":1,"max":1e9}`))
	f.Add("r/ready/"+host(1), []byte(`{"min":1,"max":2,"last_call":0,"ask":"x"}`))
	f.Fuzz(func(t *testing.T, rest string, value []byte) {
		fx := newFixture(t)
		fx.join(0, 1)
		fx.C10dWrite(Prefix+rest, value)
		fx.ready("r", `{"min":1,"max":2,"last_call":0}`, 0, 1)
		require.LessOrEqual(t, len(fx.runs), MaxRuns)
		for _, r := range fx.rounds {
			require.LessOrEqual(t, len(r.Participants), 2)
		}
	})
}

// A hang: the pods report their ranks' progress through the store; once no rank has advanced for the timeout, Tick
// restarts the round (its agents are told a node waits), once, naming the rank that stopped first, and the same
// members form the next round, whose ranks are judged afresh. A rank slower than the others is a straggler, only
// reported; a non-member's report is not heard.
func TestHang(t *testing.T) {
	const elastic = `{"min":2,"max":2,"last_call":0}`
	f := newFixture(t)
	now := time.Unix(1000, 0)
	var hangs []progress.Verdict
	var slow [][]progress.Straggler
	f.cfg.Now = func() time.Time { return now }
	f.cfg.Hang = HangConfig{Enabled: true, Timeout: 10 * time.Second,
		OnHang:       func(_ string, _ int, v progress.Verdict) { hangs = append(hangs, v) },
		OnStragglers: func(_ string, _ int, v progress.Verdict) { slow = append(slow, v.Stragglers) }}
	f.join(0, 1)
	f.ready("r", elastic, 0, 1)
	require.Equal(t, "round=1 waiting=0", f.get(StateKey("r")))
	report := func(i, rank int, step, ageMs, stepMs int64) {
		v := progress.Report{Ranks: []progress.RankReport{{Rank: rank, Step: step, AgeMs: ageMs, StepMs: stepMs}}}.Encode()
		f.C10dWrite(Prefix+"r/progress/"+host(i), v)
	}
	f.Tick()
	require.Empty(t, hangs, "no progress reported: never hung")

	now = now.Add(time.Second)
	report(0, 0, 10, 0, 100)
	report(1, 1, 10, 0, 400) // four times slower, still advancing
	report(9, 9, 1, 0, 100)  // no member
	f.Tick()
	require.Equal(t, 2, f.Progress("r").Ranks)
	require.Len(t, slow, 1)
	require.Equal(t, 1, slow[0][0].Rank)
	now = now.Add(9 * time.Second)
	report(1, 1, 11, 0, 400)
	report(0, 0, 11, 1000, 100)
	f.Tick()
	require.Empty(t, hangs)

	now = now.Add(10 * time.Second) // rank 1 froze 10 s ago, rank 0 a second before it
	f.Tick()
	f.Tick()
	require.Len(t, hangs, 1, "once per round")
	require.Equal(t, []int{0, 1}, []int{hangs[0].Stopped[0].Rank, hangs[0].Stopped[1].Rank}, "the rank that advanced first, of those at the least step")
	require.Equal(t, "round=1 waiting=1 hung=1", f.get(StateKey("r")), "the agents restart, and stop their workers at once")
	require.Contains(t, f.log.String(), "round 1 hung: no rank advanced for 10s (timeout 10s)")

	f.ready("r", elastic, 0, 1)
	require.Equal(t, "round=2 waiting=0", f.get(StateKey("r")), "the same members form the next round")
	now = now.Add(time.Minute)
	report(0, 0, 11, 70_000, 100) // a report of the old round's worker: not of this round
	f.Tick()
	require.Len(t, hangs, 1)
	require.Zero(t, f.Progress("r").Ranks)

	// A round that re-forms (a member lost: its agents restart) stops advancing for that: no hang.
	report(0, 0, 3, 0, 100)
	f.leave(1)
	now = now.Add(time.Hour)
	f.Tick()
	require.Len(t, hangs, 1, "a re-forming round is not hung")
}
