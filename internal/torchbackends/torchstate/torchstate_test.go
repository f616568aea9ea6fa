package torchstate

import (
	"encoding/base64"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

var update = flag.Bool("update", false, "regenerate testdata/torch-*.pickle with the trainer root filesystems' torch")

// suites maps each pickle in testdata to the root filesystem whose torch wrote it.
var suites = map[string]string{"torch-2.14.pickle": testenv.SuiteForky, "torch-2.6.pickle": testenv.SuiteTrixie}

// TestDecodeTorchPickles reads states pickled by torch itself (testdata/gen.py
// with torch's classes), as the etcd-v2 and c10d backends store them.
func TestDecodeTorchPickles(t *testing.T) {
	node := func(i int) Node {
		return Node{Addr: "job-worker-" + string(rune('0'+i)) + ".job.default.svc", PID: 40 + i}
	}
	at := func(s int) time.Time { return time.Date(2026, 11, 24, 17, 0, s, 250_000_000, time.UTC) }
	want := State{
		Round:    3,
		Complete: true,
		Participants: []Participant{
			{Node: node(2), Rank: 0}, {Node: node(0), Rank: 1}, {Node: node(1), Rank: 2},
		},
		Waiting:    []Node{node(3)},
		Heartbeats: map[Node]time.Time{node(0): at(0), node(1): at(1), node(2): at(2), node(3): at(3)},
	}
	for file, suite := range suites {
		t.Run(file, func(t *testing.T) {
			path := filepath.Join("testdata", file)
			if *update {
				root := testenv.Rootfs(t, suite)
				out, err := testenv.InRootfs(root, "/usr/bin/python3", mustAbs(t, "testdata/gen.py")).Output()
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(path, out, 0o644))
			}
			raw, err := os.ReadFile(path)
			require.NoError(t, err)
			got, err := Decode(raw)
			require.NoError(t, err)
			if d := cmp.Diff(want, got); d != "" {
				t.Fatalf("state (-want +got):\n%s", d)
			}
			got, err = DecodeBase64([]byte(base64.StdEncoding.EncodeToString(raw)))
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
}

func TestDecodeRefuses(t *testing.T) {
	raw, err := os.ReadFile("testdata/torch-2.14.pickle")
	require.NoError(t, err)
	for name, c := range map[string]struct {
		in   []byte
		want string
	}{
		"empty":                 {nil, "unpickle rendezvous state"},
		"truncated":             {raw[:len(raw)/2], "unpickle rendezvous state"},
		"not a state":           {[]byte("\x80\x04K\x03."), "not a _RendezvousState: int"},
		"foreign class":         {[]byte("\x80\x04\x8c\x02os\x8c\x06system\x93."), "refusing os.system"},
		"length beyond the end": {[]byte("\x80\x04\x95\xea\x0b\x18\x11\x00\x03\x00\x00\x00\x94."), "opcode 0x95 claims 3298821671914 bytes, the pickle has 3 left"},
		"too large":             {make([]byte, MaxStateLen+1), "over the limit"},
		"a long integer":        {append(append([]byte("\x80\x04\x8b\x00\x00\x01\x00"), make([]byte, 1<<16)...), '.'), "an integer of 65536 bytes"},
		"a long text argument":  {[]byte("\x80\x02c" + strings.Repeat("m", 300) + "\nx\n."), "an argument of 300 bytes"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(c.in)
			require.ErrorContains(t, err, c.want)
		})
	}
	// An error quotes at most a short prefix of the input.
	big := []byte("\x80\x04X\x00\x00\x04\x00" + strings.Repeat("m", 1<<18) + "X\x01\x00\x00\x00x\x93.")
	_, err = Decode(big)
	require.ErrorContains(t, err, "refusing")
	require.Less(t, len(err.Error()), 400)
	_, err = DecodeBase64([]byte("not base64!"))
	require.ErrorContains(t, err, "not base64")
}

func FuzzDecode(f *testing.F) {
	for file := range suites {
		raw, err := os.ReadFile(filepath.Join("testdata", file))
		require.NoError(f, err)
		f.Add(raw)
	}
	f.Add([]byte("\x80\x04K\x03."))
	f.Fuzz(func(t *testing.T, raw []byte) {
		st, err := Decode(raw)
		if err == nil && st.Heartbeats == nil {
			t.Fatal("a decoded state has a heartbeat map")
		}
	})
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	require.NoError(t, err)
	return a
}
