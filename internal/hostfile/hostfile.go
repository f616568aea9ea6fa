// Package hostfile renders MPI hostfiles and Horovod's host discovery script
// from a list of members. It is pure: no I/O (writing the files is the
// sidecar's job, through atomicfile).
package hostfile

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/membership"
)

// Flavour is a hostfile syntax: one of constants.HostfileFormats.
type Flavour string

// Supported flavours.
const (
	OpenMPI  Flavour = constants.FlavourOpenMPI  // "host slots=N"
	MPICH    Flavour = constants.FlavourMPICH    // "host:N" (Hydra)
	IntelMPI Flavour = constants.FlavourIntelMPI // "host:N" (Intel MPI's Hydra -machinefile)
	Horovod  Flavour = constants.FormatHorovod   // "host:slots", what a discovery script prints
)

// ParseFlavour checks a flavour name against constants.HostfileFormats.
func ParseFlavour(s string) (Flavour, error) {
	if !slices.Contains(constants.HostfileFormats, s) {
		return "", fmt.Errorf("unknown hostfile flavour %q (valid: %s)", s, strings.Join(constants.HostfileFormats, ", "))
	}
	return Flavour(s), nil
}

// ErrNoMembers is returned when there is nothing to render: an empty
// hostfile makes Hydra silently run everything locally, so we never write one.
var ErrNoMembers = errors.New("no members")

// Validate refuses a list that real launchers choke on: an empty one,
// invalid members (membership.Member.Validate) and duplicate hosts (Open MPI
// rejects duplicate slot lines).
func Validate(ms []membership.Member) error {
	if len(ms) == 0 {
		return ErrNoMembers
	}
	seen := make(map[string]struct{}, len(ms))
	var errs []error
	for _, m := range ms {
		if err := m.Validate(); err != nil {
			errs = append(errs, err)
		}
		key := strings.ToLower(m.Host)
		if _, dup := seen[key]; dup {
			errs = append(errs, fmt.Errorf("member %q: listed twice", m.Host))
		}
		seen[key] = struct{}{}
	}
	return errors.Join(errs...)
}

// Render validates ms and renders them in flavour f, one host per line in
// membership.Sorted order, LF line endings, full DNS names.
func Render(f Flavour, ms []membership.Member) ([]byte, error) {
	if err := Validate(ms); err != nil {
		return nil, fmt.Errorf("render hostfile: %w", err)
	}
	var b strings.Builder
	b.Grow(len(ms) * 64)
	for _, m := range membership.Sorted(ms) {
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
func DiscoverScript(ms []membership.Member) ([]byte, error) {
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
