package torchstate

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
)

// TestEncodeRoundTrip: what encode writes decodes to the state torch wrote,
// and encodes to the same bytes again.
func TestEncodeRoundTrip(t *testing.T) {
	for file := range suites {
		t.Run(file, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", file))
			require.NoError(t, err)
			want, err := Decode(raw)
			require.NoError(t, err)
			o, err := load(raw)
			require.NoError(t, err)
			out, err := encode(o)
			require.NoError(t, err)
			got, err := Decode(out)
			require.NoError(t, err)
			if d := cmp.Diff(want, got); d != "" {
				t.Fatalf("state after encode (-torch's +ours):\n%s", d)
			}
			o2, err := load(out)
			require.NoError(t, err)
			again, err := encode(o2)
			require.NoError(t, err)
			require.Equal(t, out, again)
		})
	}
}

func TestWithWaiting(t *testing.T) {
	raw, err := os.ReadFile("testdata/torch-2.14.pickle")
	require.NoError(t, err)
	b := []byte(base64.StdEncoding.EncodeToString(raw))
	before, err := DecodeBase64(b)
	require.NoError(t, err)
	ph := Node{Addr: "sidecar", PID: 0, LocalID: 3}
	at := time.Date(2026, 11, 25, 9, 0, 0, 123456789, time.UTC)

	with, err := WithWaiting(b, ph, at)
	require.NoError(t, err)
	got, err := DecodeBase64(with)
	require.NoError(t, err)
	want := before
	want.Waiting = append(slices.Clone(before.Waiting), ph)
	want.Heartbeats = map[Node]time.Time{ph: at.Truncate(time.Microsecond)}
	for n, hb := range before.Heartbeats {
		want.Heartbeats[n] = hb
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("with the placeholder (-want +got):\n%s", d)
	}

	again, err := WithWaiting(with, ph, at.Add(time.Second))
	require.NoError(t, err)
	st, err := DecodeBase64(again)
	require.NoError(t, err)
	require.Len(t, st.Waiting, len(want.Waiting), "adding twice keeps one")
	require.Equal(t, at.Add(time.Second).Truncate(time.Microsecond), st.Heartbeats[ph].UTC())

	without, err := WithoutWaiting(with, ph)
	require.NoError(t, err)
	got, err = DecodeBase64(without)
	require.NoError(t, err)
	if d := cmp.Diff(before, got); d != "" {
		t.Fatalf("placeholder removed (-before +got):\n%s", d)
	}
}

// A state of torch 1.13 keeps naive times; the placeholder's must be naive
// too, or torch's _sanitize fails comparing them.
func TestWithWaitingNaive(t *testing.T) {
	raw, err := os.ReadFile("testdata/torch-2.14.pickle")
	require.NoError(t, err)
	o, err := load(raw)
	require.NoError(t, err)
	hb, err := dictAttr(o, "last_heartbeats")
	require.NoError(t, err)
	for i, e := range *hb {
		(*hb)[i].Value = e.Value.(time.Time).In(naive)
	}
	out, err := encode(o)
	require.NoError(t, err)
	with, err := WithWaiting([]byte(base64.StdEncoding.EncodeToString(out)), Node{Addr: "x"}, time.Now())
	require.NoError(t, err)
	raw, err = base64.StdEncoding.DecodeString(string(with))
	require.NoError(t, err)
	o, err = load(raw)
	require.NoError(t, err)
	hb, err = dictAttr(o, "last_heartbeats")
	require.NoError(t, err)
	for _, e := range *hb {
		require.Same(t, naive, e.Value.(time.Time).Location())
	}
}

func TestEditRefuses(t *testing.T) {
	_, err := WithWaiting([]byte("!!"), Node{}, time.Now())
	require.ErrorContains(t, err, "not base64")
	_, err = WithWaiting([]byte(base64.StdEncoding.EncodeToString([]byte("\x80\x04K\x03."))), Node{}, time.Now())
	require.ErrorContains(t, err, "not a _RendezvousState")
}

func FuzzWithWaiting(f *testing.F) {
	for file := range suites {
		raw, err := os.ReadFile(filepath.Join("testdata", file))
		require.NoError(f, err)
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		b := []byte(base64.StdEncoding.EncodeToString(raw))
		with, err := WithWaiting(b, Node{Addr: "p"}, time.Unix(1e9, 0))
		if err != nil {
			return
		}
		st, err := DecodeBase64(with)
		if err != nil {
			t.Fatalf("our own encoding does not decode: %v", err)
		}
		if !slices.Contains(st.Waiting, Node{Addr: "p"}) {
			t.Fatalf("placeholder not waiting: %+v", st.Waiting)
		}
		if _, err := WithoutWaiting(with, Node{Addr: "p"}); err != nil {
			t.Fatal(err)
		}
		out, _, err := WithoutParticipants(b, func(a string) bool { return len(a)%2 == 0 }, Node{Addr: "p"}, time.Unix(1e9, 0))
		if err != nil {
			t.Fatalf("WithoutParticipants failed where WithWaiting did not: %v", err)
		}
		if _, err := DecodeBase64(out); err != nil {
			t.Fatalf("our own encoding does not decode: %v", err)
		}
	})
}

func TestEncodeBase64(t *testing.T) {
	raw, err := os.ReadFile("testdata/torch-2.14.pickle")
	require.NoError(t, err)
	st, err := Decode(raw)
	require.NoError(t, err)
	b, err := EncodeBase64(st)
	require.NoError(t, err)
	got, err := DecodeBase64(b)
	require.NoError(t, err)
	if d := cmp.Diff(st, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func TestWithoutParticipants(t *testing.T) {
	raw, err := os.ReadFile("testdata/torch-2.14.pickle")
	require.NoError(t, err)
	b := []byte(base64.StdEncoding.EncodeToString(raw))
	before, err := DecodeBase64(b)
	require.NoError(t, err)
	ph := Node{Addr: "sidecar", LocalID: 3}
	at := time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)
	lost := before.Participants[1].Node // rank 1

	out, dropped, err := WithoutParticipants(b, func(addr string) bool { return addr == lost.Addr }, ph, at)
	require.NoError(t, err)
	require.Equal(t, []Node{lost}, dropped)
	got, err := DecodeBase64(out)
	require.NoError(t, err)
	want := before
	want.Participants = []Participant{before.Participants[0], before.Participants[2]}
	want.Waiting = append(slices.Clone(before.Waiting), ph)
	want.Heartbeats = map[Node]time.Time{ph: at}
	for n, hb := range before.Heartbeats {
		if n != lost {
			want.Heartbeats[n] = hb
		}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}

	same, dropped, err := WithoutParticipants(b, func(string) bool { return false }, ph, at)
	require.NoError(t, err)
	require.Empty(t, dropped)
	require.Equal(t, b, same)
}

// The last participant dropped ends the round as torch does: the next round,
// not complete, and no placeholder (nobody is left to restart).
func TestWithoutTheLastParticipants(t *testing.T) {
	raw, err := os.ReadFile("testdata/torch-2.14.pickle")
	require.NoError(t, err)
	b := []byte(base64.StdEncoding.EncodeToString(raw))
	before, err := DecodeBase64(b)
	require.NoError(t, err)
	out, dropped, err := WithoutParticipants(b, func(string) bool { return true }, Node{Addr: "sidecar"}, time.Now())
	require.NoError(t, err)
	require.Len(t, dropped, 3)
	got, err := DecodeBase64(out)
	require.NoError(t, err)
	require.Equal(t, before.Round+1, got.Round)
	require.False(t, got.Complete)
	require.Empty(t, got.Participants)
	require.Equal(t, before.Waiting, got.Waiting, "the waiting node stays to join the next round")
}
