package hostfile

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/atomicfile"
	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/membership"
)

type Member = membership.Member

func m(host string, slots int, group string, index int) Member {
	return Member{Host: host, Slots: slots, Group: group, Index: index}
}

var three = []Member{
	m("job-worker-1.job.ns.svc.cluster.local", 2, "worker", 1),
	m("job-big-0.job.ns.svc.cluster.local", 8, "big", 0),
	m("job-worker-0.job.ns.svc.cluster.local", 4, "worker", 0),
}

func TestRender(t *testing.T) {
	tests := map[string]struct {
		flavour Flavour
		members []Member
		want    string
	}{
		"open mpi sorts by group then index and keeps FQDNs": {OpenMPI, three,
			"job-big-0.job.ns.svc.cluster.local slots=8\njob-worker-0.job.ns.svc.cluster.local slots=4\njob-worker-1.job.ns.svc.cluster.local slots=2\n"},
		"mpich uses host:N": {MPICH, three,
			"job-big-0.job.ns.svc.cluster.local:8\njob-worker-0.job.ns.svc.cluster.local:4\njob-worker-1.job.ns.svc.cluster.local:2\n"},
		"intel mpi uses host:N": {IntelMPI, three[:1], "job-worker-1.job.ns.svc.cluster.local:2\n"},
		"index orders numerically, not as text": {OpenMPI,
			[]Member{m("w-10", 1, "w", 10), m("w-9", 1, "w", 9)}, "w-9 slots=1\nw-10 slots=1\n"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Render(tt.flavour, tt.members)
			require.NoError(t, err)
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Errorf("Render (-want +got):\n%s", diff)
			}
		})
	}
}

func TestValidateRefusesWhatLaunchersChokeOn(t *testing.T) {
	tests := map[string]struct {
		members []Member
		wantErr string
	}{
		"empty list (Hydra would run locally)": {nil, "no members"},
		"zero slots (Hydra SIGFPE)":            {[]Member{m("a", 0, "g", 0)}, "slots must be ≥ 1"},
		"negative slots":                       {[]Member{m("a", -1, "g", 0)}, "slots must be ≥ 1"},
		"underscore (Open MPI rejects)":        {[]Member{m("a_b", 1, "g", 0)}, "not allowed"},
		"space":                                {[]Member{m("a b", 1, "g", 0)}, "not allowed"},
		"ipv6 literal":                         {[]Member{m("fe80::1", 1, "g", 0)}, "not allowed"},
		"empty host":                           {[]Member{m("", 1, "g", 0)}, "empty"},
		"empty label":                          {[]Member{m("a..b", 1, "g", 0)}, "label"},
		"leading hyphen":                       {[]Member{m("-a", 1, "g", 0)}, "start or end"},
		"duplicate (Open MPI rejects)":         {[]Member{m("a", 1, "g", 0), m("A", 1, "g", 1)}, "listed twice"},
		"newline injection":                    {[]Member{m("a\nb slots=99", 1, "g", 0)}, "not allowed"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Render(OpenMPI, tt.members)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestParseFlavour(t *testing.T) {
	for _, f := range constants.HostfileFormats {
		got, err := ParseFlavour(f)
		require.NoError(t, err)
		require.Equal(t, Flavour(f), got)
	}
	_, err := ParseFlavour("OpenMPI")
	require.ErrorContains(t, err, "valid: openmpi")
}

func TestDiscoverScriptPrintsHostSlots(t *testing.T) {
	dir := t.TempDir()
	for name, tt := range map[string]struct {
		members []Member
		want    string
	}{
		"three members": {three, "job-big-0.job.ns.svc.cluster.local:8\njob-worker-0.job.ns.svc.cluster.local:4\njob-worker-1.job.ns.svc.cluster.local:2\n"},
		"no members":    {nil, ""},
	} {
		t.Run(name, func(t *testing.T) {
			script, err := DiscoverScript(tt.members)
			require.NoError(t, err)
			_, err = atomicfile.Write(dir, "discover_hosts.sh", script, 0o555)
			require.NoError(t, err)
			out, err := exec.Command(filepath.Join(dir, "discover_hosts.sh")).Output()
			require.NoError(t, err)
			require.Equal(t, tt.want, string(out))
			require.NotContains(t, string(out), "#", "Horovod parses a comment line as a host")
		})
	}
}

func FuzzRender(f *testing.F) {
	f.Add("job-w-0.job.ns.svc.cluster.local", 4, "g", 0, "job-w-1", 2)
	f.Add("a_b", 0, "", -1, "a_b", -5)
	f.Add("a\r\nb", 1, "x", 1, "", 1)
	f.Add(strings.Repeat("a", 70), 1, "x", 1, "b.", 3)
	f.Fuzz(func(t *testing.T, h1 string, s1 int, g string, i1 int, h2 string, s2 int) {
		ms := []Member{m(h1, s1, g, i1), m(h2, s2, g, i1+1)}
		for _, name := range constants.HostfileFormats {
			f := Flavour(name)
			out, err := Render(f, ms)
			if err != nil {
				continue
			}
			// Whatever renders must be exactly two well-formed lines.
			lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
			if len(lines) != 2 {
				t.Fatalf("%s: %d lines from 2 members: %q", f, len(lines), out)
			}
			for _, l := range lines {
				if strings.ContainsAny(l, " \t\r") && f != OpenMPI {
					t.Fatalf("%s: whitespace in %q", f, l)
				}
				if strings.Count(l, " ") > 1 || strings.Contains(l, "\r") {
					t.Fatalf("%s: malformed line %q", f, l)
				}
			}
		}
	})
}

func members(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = m(fmt.Sprintf("job-worker-%d.job.default.svc.cluster.local", i), 8, "worker", n-i)
	}
	return ms
}

func BenchmarkRender1000(b *testing.B) {
	ms := members(1000)
	for b.Loop() {
		if _, err := Render(OpenMPI, ms); err != nil {
			b.Fatal(err)
		}
	}
}
