// Package hostfile renders MPI hostfiles and Horovod's host discovery script
// from a list of members. It is pure: no I/O except the explicit atomic
// write helper in write.go.
package hostfile

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// File modes of what we write into the shared volume.
const (
	HostfileMode = 0o444 // read by launchers, never written by them
	ScriptMode   = 0o555 // executed by Horovod's --host-discovery-script
)

// Member is one registered training member.
type Member struct {
	Host  string `json:"host"`  // full DNS name (pod FQDN)
	Slots int    `json:"slots"` // processes/accelerators on this host, ≥ 1
	Group string `json:"group"` // worker group
	Index int    `json:"index"` // index within the group
}

// Flavour is a hostfile syntax.
type Flavour string

// Supported flavours. Values match constants.Flavour*.
const (
	OpenMPI  Flavour = constants.FlavourOpenMPI  // "host slots=N"
	MPICH    Flavour = constants.FlavourMPICH    // "host:N" (Hydra)
	IntelMPI Flavour = constants.FlavourIntelMPI // "host:N" (Intel MPI's Hydra -machinefile)
	Horovod  Flavour = "horovod"                 // "host:slots", what a discovery script prints
)

// Flavours lists every flavour ParseFlavour accepts.
var Flavours = []Flavour{OpenMPI, MPICH, IntelMPI, Horovod}

// ParseFlavour checks a flavour name.
func ParseFlavour(s string) (Flavour, error) {
	for _, f := range Flavours {
		if string(f) == s {
			return f, nil
		}
	}
	return "", fmt.Errorf("unknown hostfile flavour %q (valid: openmpi, mpich, intelmpi, horovod)", s)
}

// ErrNoMembers is returned when there is nothing to render: an empty
// hostfile makes Hydra silently run everything locally, so we never write one.
var ErrNoMembers = errors.New("no members")

// Sorted returns a copy of ms in the stable order every output uses:
// group, then index, then host.
func Sorted(ms []Member) []Member {
	out := append([]Member(nil), ms...)
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		if a.Index != b.Index {
			return a.Index < b.Index
		}
		return a.Host < b.Host
	})
	return out
}

// Validate refuses what real launchers choke on: slots ≤ 0 (Hydra dies with
// SIGFPE on host:0; Open MPI still starts a daemon there), host names Open MPI
// rejects (underscores, spaces, ':' or anything outside letters, digits, '-'
// and '.'), and duplicate hosts (Open MPI rejects duplicate slot lines).
func Validate(ms []Member) error {
	if len(ms) == 0 {
		return ErrNoMembers
	}
	seen := make(map[string]struct{}, len(ms))
	var errs []error
	for _, m := range ms {
		if err := ValidateHost(m.Host); err != nil {
			errs = append(errs, err)
		}
		if m.Slots <= 0 {
			errs = append(errs, fmt.Errorf("member %q: slots must be ≥ 1, got %d", m.Host, m.Slots))
		}
		key := strings.ToLower(m.Host)
		if _, dup := seen[key]; dup {
			errs = append(errs, fmt.Errorf("member %q: listed twice", m.Host))
		}
		seen[key] = struct{}{}
	}
	return errors.Join(errs...)
}

// ValidateHost checks that name is a DNS name (RFC 1123 labels) that every
// launcher accepts.
func ValidateHost(name string) error {
	if name == "" {
		return errors.New("member host is empty")
	}
	if len(name) > 253 {
		return fmt.Errorf("member host %.40q...: longer than 253 characters", name)
	}
	for _, label := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("member host %q: each dot-separated label must have 1 to 63 characters", name)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("member host %q: a label may not start or end with '-'", name)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("member host %q: character %q is not allowed (letters, digits, '-' and '.' only)", name, c)
			}
		}
	}
	return nil
}

// Render validates ms and renders them in flavour f, one host per line in
// Sorted order, LF line endings, full DNS names.
func Render(f Flavour, ms []Member) ([]byte, error) {
	if err := Validate(ms); err != nil {
		return nil, fmt.Errorf("render hostfile: %w", err)
	}
	var b strings.Builder
	b.Grow(len(ms) * 64)
	for _, m := range Sorted(ms) {
		b.WriteString(m.Host)
		switch f {
		case OpenMPI:
			b.WriteString(" slots=")
		case MPICH, IntelMPI, Horovod:
			b.WriteByte(':')
		default:
			return nil, fmt.Errorf("render hostfile: unknown flavour %q", f)
		}
		b.WriteString(strconv.Itoa(m.Slots))
		b.WriteByte('\n')
	}
	return []byte(b.String()), nil
}

// DiscoverScript renders an executable /bin/sh script that prints
// "host:slots" per member for Horovod elastic's --host-discovery-script.
// With no members it prints nothing (Horovod then waits for hosts). It
// prints no comments: Horovod would take "# ..." for a host name.
func DiscoverScript(ms []Member) ([]byte, error) {
	var body []byte
	if len(ms) > 0 {
		var err error
		if body, err = Render(Horovod, ms); err != nil {
			return nil, fmt.Errorf("render discovery script: %w", err)
		}
	}
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Written by rdzv-sidecar; replaced atomically on every membership change.\ncat <<'ELASTIC_TRAINING_HOSTS'\n")
	b.Write(body)
	b.WriteString("ELASTIC_TRAINING_HOSTS\n")
	return []byte(b.String()), nil
}
