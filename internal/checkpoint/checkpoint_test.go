package checkpoint

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func manifest(step int64, id string, rank, world int) Manifest {
	files := []File{{Name: fmt.Sprintf("__%d_0.distcp", rank), Size: 100}}
	if rank == 0 {
		files = append(files, File{Name: ".metadata", Size: 10})
	}
	return Manifest{Save: SaveName(step, id), Step: step, Rank: rank, World: world, Files: files}
}

func TestParseManifest(t *testing.T) {
	good := manifest(7, "00c0ffee", 1, 2)
	m, err := ParseManifest(good.Encode())
	require.NoError(t, err)
	assert.Equal(t, good, m)
	assert.Equal(t, int64(100), m.Bytes())

	for name, tc := range map[string]struct{ json, err string }{
		"not json":      {`{`, "manifest: unexpected EOF"},
		"unknown field": {`{"save":"step-000000000007-00c0ffee","extra":1}`, `unknown field "extra"`},
		"two objects":   {string(good.Encode()) + `{}`, "data after the object"},
		"bad save":      {`{"save":"../x","step":7,"rank":0,"world":1,"files":[{"name":"a","size":1}]}`, "not step-<12 digits>-<hex id>"},
		"step mismatch": {`{"save":"step-000000000007-00c0ffee","step":8,"rank":0,"world":1,"files":[{"name":"a","size":1}]}`, "step 8 is not the save's"},
		"rank too high": {`{"save":"step-000000000007-00c0ffee","step":7,"rank":2,"world":2,"files":[{"name":"a","size":1}]}`, "rank 2 is not below the world size 2"},
		"world zero":    {`{"save":"step-000000000007-00c0ffee","step":7,"rank":0,"world":0,"files":[{"name":"a","size":1}]}`, "world 0 is not 1 to"},
		"no files":      {`{"save":"step-000000000007-00c0ffee","step":7,"rank":0,"world":1,"files":[]}`, "0 files"},
		"path in name":  {`{"save":"step-000000000007-00c0ffee","step":7,"rank":0,"world":1,"files":[{"name":"../../etc/passwd","size":1}]}`, "not a file name of a save"},
		"dot dot":       {`{"save":"step-000000000007-00c0ffee","step":7,"rank":0,"world":1,"files":[{"name":"..","size":1}]}`, "not a file name of a save"},
		"file twice":    {`{"save":"step-000000000007-00c0ffee","step":7,"rank":0,"world":1,"files":[{"name":"a","size":1},{"name":"a","size":1}]}`, `file "a" twice`},
		"negative size": {`{"save":"step-000000000007-00c0ffee","step":7,"rank":0,"world":1,"files":[{"name":"a","size":-1}]}`, "negative size"},
		"bad checksum":  {`{"save":"step-000000000007-00c0ffee","step":7,"rank":0,"world":1,"files":[{"name":"a","size":1,"sha256":"XYZ"}]}`, "64 hex digits"},
		"too big":       {`{"save":"` + strings.Repeat("a", maxManifest) + `"}`, "more than"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseManifest([]byte(tc.json))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.err)
		})
	}
}

func FuzzParseManifest(f *testing.F) {
	f.Add(manifest(7, "00c0ffee", 0, 2).Encode())
	f.Add([]byte(`{"save":"step-000000000001-abcdef01","step":1,"rank":0,"world":1,"files":[{"name":"a","size":1,"sha256":"` + strings.Repeat("a", 64) + `"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest(data)
		if err != nil {
			return
		}
		// What parses is what a holder announces and serves: it must round-trip and name only plain files.
		again, err := ParseManifest(m.Encode())
		require.NoError(t, err)
		assert.Equal(t, m, again)
		for _, file := range m.Files {
			assert.NotContains(t, file.Name, "/")
		}
		ix := NewIndex()
		require.NoError(t, ix.Announce("a", true, m))
		assert.Equal(t, m.World == 1, ix.Complete(m.Save))
	})
}

func TestIndexComplete(t *testing.T) {
	ix := NewIndex()
	require.NoError(t, ix.Announce("a", true, manifest(1, "aaaaaaaa", 0, 2)))
	assert.False(t, ix.Complete(SaveName(1, "aaaaaaaa")), "rank 1 missing")
	_, ok := ix.Newest()
	assert.False(t, ok)
	require.NoError(t, ix.Announce("b", true, manifest(1, "aaaaaaaa", 1, 2)))
	newest, ok := ix.Newest()
	require.True(t, ok)
	assert.Equal(t, int64(1), newest.Step)

	// A newer step in progress: the newest complete stays step 1.
	require.NoError(t, ix.Announce("a", true, manifest(2, "bbbbbbbb", 0, 2)))
	newest, _ = ix.Newest()
	assert.Equal(t, int64(1), newest.Step)
	require.NoError(t, ix.Announce("b", true, manifest(2, "bbbbbbbb", 1, 2)))
	newest, _ = ix.Newest()
	assert.Equal(t, int64(2), newest.Step)

	// The only holder of a piece gone: that step is no longer complete, the one before is the newest.
	ix.Forget("b", Piece{SaveName(2, "bbbbbbbb"), 1})
	newest, _ = ix.Newest()
	assert.Equal(t, int64(1), newest.Step)

	// A copy held elsewhere keeps a step complete.
	require.NoError(t, ix.Announce("c", false, manifest(1, "aaaaaaaa", 1, 2)))
	ix.Forget("b", Piece{SaveName(1, "aaaaaaaa"), 1})
	assert.True(t, ix.Complete(SaveName(1, "aaaaaaaa")))
	assert.Equal(t, []string{"c"}, ix.Holders(Piece{SaveName(1, "aaaaaaaa"), 1}))
	_, isOrigin := ix.Origin(Piece{SaveName(1, "aaaaaaaa"), 1})
	assert.False(t, isOrigin, "the origin dropped it")
	p, f, ok := ix.File(SaveName(1, "aaaaaaaa"), ".metadata")
	require.True(t, ok)
	assert.Equal(t, Piece{SaveName(1, "aaaaaaaa"), 0}, p)
	assert.Equal(t, int64(10), f.Size)
}

func TestIndexRefusesMixing(t *testing.T) {
	ix := NewIndex()
	require.NoError(t, ix.Announce("a", true, manifest(1, "aaaaaaaa", 0, 2)))
	err := ix.Announce("b", true, manifest(1, "aaaaaaaa", 1, 3))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "world 3, others 2")
	other := manifest(1, "aaaaaaaa", 0, 2)
	other.Files[0].Size = 99
	err = ix.Announce("b", false, other)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "other files")
	assert.Equal(t, []string{"a"}, ix.Holders(Piece{SaveName(1, "aaaaaaaa"), 0}))
}

func TestSameStepTwoSaves(t *testing.T) {
	// A job restarted at a step it had saved saves that step again under another id: the later save wins.
	ix := NewIndex()
	require.NoError(t, ix.Announce("a", true, manifest(5, "aaaaaaaa", 0, 1)))
	require.NoError(t, ix.Announce("a", true, manifest(5, "bbbbbbbb", 0, 1)))
	newest, _ := ix.Newest()
	assert.Equal(t, SaveName(5, "bbbbbbbb"), newest.Save)
}

func TestDesired(t *testing.T) {
	members := []Holder{{"a", "n1"}, {"b", "n1"}, {"c", "n2"}, {"d", "n2"}}
	p := Piece{SaveName(1, "aaaaaaaa"), 0}
	for _, tc := range []struct {
		name   string
		origin string
		copies int
		check  func(t *testing.T, got []string)
	}{
		{"the copy is on the other node", "a", 2, func(t *testing.T, got []string) {
			require.Len(t, got, 2)
			assert.Equal(t, "a", got[0])
			assert.Contains(t, []string{"c", "d"}, got[1])
		}},
		{"three copies: both nodes, then any", "c", 3, func(t *testing.T, got []string) {
			require.Len(t, got, 3)
			assert.Equal(t, "c", got[0])
			assert.Contains(t, []string{"a", "b"}, got[1])
		}},
		{"no more than the members", "a", 9, func(t *testing.T, got []string) { assert.Len(t, got, 4) }},
		{"origin gone: still two", "gone", 2, func(t *testing.T, got []string) {
			require.Len(t, got, 2)
			assert.NotEqual(t, nodeOf(members, got[0]), nodeOf(members, got[1]))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.check(t, Desired(p, tc.origin, members, tc.copies)) })
	}
}

func nodeOf(ms []Holder, host string) string {
	for _, m := range ms {
		if m.Host == host {
			return m.Node
		}
	}
	return ""
}

// Rendezvous hashing: a member that joins takes over only about its share of the copies.
func TestDesiredMovesLittle(t *testing.T) {
	var members []Holder
	for i := range 10 {
		members = append(members, Holder{fmt.Sprintf("pod-%d", i), fmt.Sprintf("node-%d", i)})
	}
	grown := append(append([]Holder(nil), members...), Holder{"pod-10", "node-10"})
	moved, n := 0, 1000
	for i := range n {
		p := Piece{SaveName(int64(i), "aaaaaaaa"), i % 7}
		before := Desired(p, "pod-0", members, 2)
		after := Desired(p, "pod-0", grown, 2)
		if before[1] != after[1] {
			moved++
			assert.Equal(t, "pod-10", after[1], "a copy moves only to the new member")
		}
	}
	// Its fair share is 1/10 of the copies (pod-0 is the origin of all): allow twice that.
	assert.Less(t, moved, n/5, "moved %d of %d", moved, n)
	assert.Greater(t, moved, 0)
}

func TestPlan(t *testing.T) {
	members := []Holder{{"a", "n1"}, {"b", "n2"}}
	s1, s2, s3 := SaveName(1, "aaaaaaaa"), SaveName(2, "aaaaaaaa"), SaveName(3, "aaaaaaaa")
	ix := NewIndex()
	for _, m := range []Manifest{manifest(1, "aaaaaaaa", 0, 2), manifest(2, "aaaaaaaa", 0, 2)} {
		require.NoError(t, ix.Announce("a", true, m))
	}
	for _, m := range []Manifest{manifest(1, "aaaaaaaa", 1, 2), manifest(2, "aaaaaaaa", 1, 2)} {
		require.NoError(t, ix.Announce("b", true, m))
	}
	// Step 2 is complete but not replicated: keep step 1 too; each fetches the other's pieces of both.
	plan := ix.Plan("a", members, 1, []string{s1, s2})
	assert.Equal(t, []Piece{{s2, 1}, {s1, 1}}, plan.Fetch)
	assert.Empty(t, plan.Drop)

	require.NoError(t, ix.Announce("a", false, manifest(2, "aaaaaaaa", 1, 2)))
	require.NoError(t, ix.Announce("b", false, manifest(2, "aaaaaaaa", 0, 2)))
	// Replicated: step 1 goes, a save being written (not announced, newer) stays, a leftover older one goes.
	leftover := SaveName(0, "cccccccc")
	plan = ix.Plan("a", members, 1, []string{s1, s2, s3, leftover})
	assert.Empty(t, plan.Fetch)
	assert.Equal(t, []string{s1, leftover}, plan.Drop)

	// No peers: nothing to fetch, the newest complete kept.
	alone := NewIndex()
	require.NoError(t, alone.Announce("a", true, manifest(1, "aaaaaaaa", 0, 1)))
	require.NoError(t, alone.Announce("a", true, manifest(2, "aaaaaaaa", 0, 1)))
	plan = alone.Plan("a", []Holder{{"a", "n1"}}, 1, []string{s1, s2})
	assert.Empty(t, plan.Fetch)
	assert.Equal(t, []string{s1}, plan.Drop)
}

// Copies that lag the saves: steps 2 and 3 are complete but not replicated, step 1 is. The holders keep step 3
// (the newest) and step 1 (the last a node's loss leaves whole), not step 2, which a loss would take with step 3.
func TestPlanKeepsTheLastReplicated(t *testing.T) {
	members := []Holder{{"a", "n1"}, {"b", "n2"}}
	ix := NewIndex()
	for step := int64(1); step <= 3; step++ {
		require.NoError(t, ix.Announce("a", true, manifest(step, "aaaaaaaa", 0, 2)))
		require.NoError(t, ix.Announce("b", true, manifest(step, "aaaaaaaa", 1, 2)))
	}
	require.NoError(t, ix.Announce("a", false, manifest(1, "aaaaaaaa", 1, 2)))
	require.NoError(t, ix.Announce("b", false, manifest(1, "aaaaaaaa", 0, 2)))
	s1, s2, s3 := SaveName(1, "aaaaaaaa"), SaveName(2, "aaaaaaaa"), SaveName(3, "aaaaaaaa")
	plan := ix.Plan("a", members, 1, []string{s1, s2, s3})
	assert.Equal(t, []string{s2}, plan.Drop)
	assert.Equal(t, []Piece{{s3, 1}}, plan.Fetch, "the newest's copies, and none of the dropped one's")
}

// A pod lost with its node keeps its announcements until their lease ends: a save only it held a piece of is not
// complete among the members that are left.
func TestNewestAmongMembers(t *testing.T) {
	ix := NewIndex()
	for step := int64(1); step <= 2; step++ {
		require.NoError(t, ix.Announce("a", true, manifest(step, "aaaaaaaa", 0, 2)))
		require.NoError(t, ix.Announce("lost", true, manifest(step, "aaaaaaaa", 1, 2)))
	}
	require.NoError(t, ix.Announce("a", false, manifest(1, "aaaaaaaa", 1, 2))) // only step 1's copy made it
	newest, _ := ix.Newest()
	assert.Equal(t, int64(2), newest.Step)
	members := []Holder{{"a", "n1"}}
	newest, ok := ix.NewestAmong(MemberOf(members))
	require.True(t, ok)
	assert.Equal(t, int64(1), newest.Step)
	plan := ix.Plan("a", members, 1, []string{SaveName(1, "aaaaaaaa"), SaveName(2, "aaaaaaaa")})
	assert.Empty(t, plan.Drop, "step 2 is newer than the newest complete: kept, it may still complete")
}
