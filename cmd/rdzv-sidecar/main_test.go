package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
)

func TestCommandLine(t *testing.T) {
	tests := map[string]struct {
		args    []string
		code    int
		wantOut string
	}{
		"no command":             {nil, 2, "Usage:"},
		"help":                   {[]string{"--help"}, 0, "rdzv-sidecar serve"},
		"unknown command":        {[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		"serve --help":           {[]string{"serve", "--help"}, 0, "-advertise-client-urls"},
		"join --help":            {[]string{"join", "--help"}, 0, "-member-slots"},
		"wait --help":            {[]string{"wait", "--help"}, 0, "-members"},
		"hosts --help":           {[]string{"hosts", "--help"}, 0, "-hostfile-flavour"},
		"bad url":                {[]string{"serve", "--listen-client-urls=localhost:2379"}, 2, "not an http(s)://host:port URL"},
		"bad flavour":            {[]string{"serve", "--files-dir=/tmp/x", "--hostfile-flavour=lam"}, 1, "unknown hostfile flavour"},
		"bad flavour of hosts":   {[]string{"hosts", "--endpoints=x:1", "--hostfile-flavour=lam"}, 1, "valid: openmpi, mpich, intelmpi, horovod"},
		"old flag name":          {[]string{"wait", "--flavour=mpich"}, 2, "flag provided but not defined: -flavour"},
		"progress --help":        {[]string{"progress", "--help"}, 0, "-stable"},
		"progress without url":   {[]string{"progress"}, 1, "--url is required"},
		"bad duration":           {[]string{"progress", "--url=http://x", "--stable=soon"}, 2, "invalid value"},
		"started --help":         {[]string{"started", "--help"}, 0, "-timeout"},
		"started without url":    {[]string{"started"}, 1, "--url is required"},
		"started, never":         {[]string{"started", "--url=http://127.0.0.1:1/startz", "--timeout=30ms"}, 1, "the sidecar did not start within 30ms"},
		"zero slots":             {[]string{"join", "--endpoints=x:1", "--member-host=a", "--member-slots=0"}, 1, "slots must be ≥ 1"},
		"underscore host":        {[]string{"join", "--endpoints=x:1", "--member-host=a_b"}, 1, "not allowed"},
		"join without host":      {[]string{"join", "--endpoints=x:1"}, 1, "--member-host"},
		"join without endpoints": {[]string{"join", "--member-host=a", "--endpoints="}, 1, "--endpoints is required"},
		"lease below etcd's min": {[]string{"join", "--endpoints=x:1", "--member-host=a", "--lease-ttl=1s"}, 1, "minimum of 2s"},
		"wait for zero":          {[]string{"wait", "--endpoints=x:1", "--members=0"}, 1, "--members must be ≥ 1"},
		"cert without key":       {[]string{"serve", "--cert-file=a"}, 1, "go together"},
		"unexpected args":        {[]string{"serve", "extra"}, 1, "unexpected arguments"},
		"bad log format":         {[]string{"serve", "--log-format=xml"}, 1, "--log-format"},
		"bad backend":            {[]string{"serve", "--backend=zookeeper"}, 2, `"zookeeper" is not one of etcd-v2, etcd, c10d, elastic-training`},
		"launch --help":          {[]string{"launch", "--help"}, 0, "Usage: rdzv-sidecar launch"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tt.args, &out, &errb)
			require.Equal(t, tt.code, code, "stdout %s\nstderr %s", out.String(), errb.String())
			require.Contains(t, out.String()+errb.String(), tt.wantOut)
		})
	}
}

// The webhook runs the sidecar's postStart hook as constants.SidecarImageBinary: both images put the binary there
// (the release's Dockerfile, and hack/images.sh for the local cluster, which packs /usr/local/bin/<command>).
func TestImagesKeepTheBinaryWhereTheHookRunsIt(t *testing.T) {
	for file, want := range map[string]string{
		"../../build/rdzv-sidecar.Dockerfile": `ENTRYPOINT ["` + constants.SidecarImageBinary + `"]`,
		"../../hack/images.sh":                `"/usr/local/bin/$cmd"`,
	} {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		require.Contains(t, string(b), want, file)
	}
	require.Equal(t, "/usr/local/bin/"+constants.SidecarBinaryName, constants.SidecarImageBinary, "hack/images.sh packs /usr/local/bin/<command>")
}

// README.md's paragraph on the sidecar names as many commands as there are, and each of them; the usage text lists
// every command (it is made from the same table).
func TestReadmeListsTheCommands(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, para, ok := strings.Cut(string(readme), "One static binary, ")
	require.True(t, ok, `README.md has no paragraph "One static binary, N commands"`)
	para, _, _ = strings.Cut(para, "\n\n")
	words := []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"}
	require.Less(t, len(commands), len(words))
	require.True(t, strings.HasPrefix(para, words[len(commands)]+" commands"),
		"README.md says %q, rdzv-sidecar has %d commands", strings.SplitN(para, " (", 2)[0], len(commands))
	var out bytes.Buffer
	require.Equal(t, 0, run([]string{"--help"}, &out, &out))
	for _, c := range commands {
		require.Contains(t, para, "`"+c.name+"`", "README.md's list of the sidecar's commands")
		require.Contains(t, out.String(), "rdzv-sidecar "+c.name+" ", "the usage text")
	}
}
