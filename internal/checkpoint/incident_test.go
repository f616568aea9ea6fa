package checkpoint

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseIncident(t *testing.T) {
	for _, tc := range []struct {
		name, in, err string
	}{
		{"a save", `{"kind":"save","step":12,"rank":3,"need":1073741824,"free":5}`, ""},
		{"a copy with its pod", `{"kind":"copy","host":"w-1.job.ns.svc.cluster.local","step":1,"rank":0,"need":1,"free":0,"memory":2048}`, ""},
		{"unknown kind", `{"kind":"oom","step":1,"rank":0,"need":1,"free":0}`, "kind"},
		{"unknown field", `{"kind":"save","step":1,"rank":0,"need":1,"free":0,"x":1}`, "unknown field"},
		{"two values", `{"kind":"save","step":1,"rank":0,"need":1,"free":0} {}`, "more than one"},
		{"nothing needed", `{"kind":"save","step":1,"rank":0,"need":0,"free":0}`, "need 0"},
		{"negative step", `{"kind":"save","step":-1,"rank":0,"need":1,"free":0}`, "out of range"},
		{"rank too large", `{"kind":"save","step":1,"rank":65536,"need":1,"free":0}`, "out of range"},
		{"host not a name", `{"kind":"save","host":"a b","step":1,"rank":0,"need":1,"free":0}`, "not a DNS name"},
		{"too long", `{"kind":"save","host":"` + strings.Repeat("a", 1100) + `"}`, "at most 1024"},
		{"not JSON", `kind=save`, "incident"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseIncident([]byte(tc.in))
			if tc.err == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tc.err)
			}
		})
	}
}

func TestIncidentMessage(t *testing.T) {
	save := Incident{Kind: IncidentSave, Host: "w-1", Step: 120, Rank: 3, Need: 3 << 29, Free: 1 << 28, Memory: 2 << 30}
	require.Equal(t, "Rank 3 (pod w-1) could not save step 120 in memory: it needs 1536Mi, 256Mi of 2Gi of checkpoint.memory is free. Every rank's save raised CheckpointError: raise checkpoint.memory (about 2 x (1 + replicas) x a pod's state) or save less.", save.Message())
	cp := Incident{Kind: IncidentCopy, Host: "w-2", Step: 7, Rank: 0, Need: 100, Free: 10}
	require.Equal(t, "Pod w-2 has no room for a copy of rank 0's checkpoint of step 7: it needs 100 bytes, 10 bytes of checkpoint.memory is free beyond its own next save. That piece has fewer copies than checkpoint.replicas: raise checkpoint.memory (about 2 x (1 + replicas) x a pod's state).", cp.Message())
}

func FuzzParseIncident(f *testing.F) {
	f.Add([]byte(`{"kind":"save","step":12,"rank":3,"need":1073741824,"free":5}`))
	f.Add([]byte(`{"kind":"copy","host":"w-1","step":1,"rank":0,"need":1,"free":0,"memory":2048}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := ParseIncident(data)
		if err != nil {
			return
		}
		if in.Need <= 0 || in.Rank < 0 || in.Rank >= MaxWorld || len(data) > maxIncident {
			t.Fatalf("accepted %+v from %q", in, data)
		}
		_ = in.Message()
	})
}
