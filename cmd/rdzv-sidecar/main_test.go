package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
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
		"zero slots":             {[]string{"join", "--endpoints=x:1", "--member-host=a", "--member-slots=0"}, 1, "slots must be ≥ 1"},
		"underscore host":        {[]string{"join", "--endpoints=x:1", "--member-host=a_b"}, 1, "not allowed"},
		"join without host":      {[]string{"join", "--endpoints=x:1"}, 1, "--member-host"},
		"join without endpoints": {[]string{"join", "--member-host=a", "--endpoints="}, 1, "--endpoints is required"},
		"lease below etcd's min": {[]string{"join", "--endpoints=x:1", "--member-host=a", "--lease-ttl=1s"}, 1, "minimum of 2s"},
		"wait for zero":          {[]string{"wait", "--endpoints=x:1", "--members=0"}, 1, "--members must be ≥ 1"},
		"cert without key":       {[]string{"serve", "--cert-file=a"}, 1, "go together"},
		"unexpected args":        {[]string{"serve", "extra"}, 1, "unexpected arguments"},
		"bad log format":         {[]string{"serve", "--log-format=xml"}, 1, "--log-format"},
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
