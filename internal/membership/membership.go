// Package membership is the pure member core (type, checks, encoding, order); its etcd side is membership/etcdmembers, so hostfile can import it without etcd.
package membership

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Member is one registered training member.
type Member struct {
	Host  string `json:"host"`  // full DNS name (pod FQDN)
	Slots int    `json:"slots"` // processes/accelerators on this host, ≥ 1
	Group string `json:"group"` // worker group
	Index int    `json:"index"` // index within the group
	// Node is the node the member's pod runs on, where its sidecar knows it (in-memory checkpoints place copies
	// on other nodes first); members registered by an earlier sidecar have none.
	Node string `json:"node,omitempty"`
	// Pod is the member's pod name, where its sidecar knows it: the serving sidecar names a pod blamed for repeated
	// hangs to the webhook by it (internal/podreplace).
	Pod string `json:"pod,omitempty"`
}

// Validate refuses a member that real launchers choke on: slots ≤ 0 (Hydra
// dies with SIGFPE on host:0; Open MPI still starts a daemon there) and host
// names Open MPI rejects (see ValidateHost).
func (m Member) Validate() error {
	var errs []error
	if err := ValidateHost(m.Host); err != nil {
		errs = append(errs, err)
	}
	if m.Slots <= 0 {
		errs = append(errs, fmt.Errorf("member %q: slots must be ≥ 1, got %d", m.Host, m.Slots))
	}
	return errors.Join(errs...)
}

// ValidateHost checks that name is a DNS name (RFC 1123 labels) that every
// launcher accepts: no underscores, spaces, ':' or anything outside letters,
// digits, '-' and '.'.
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

// Key is where member host is registered under prefix.
func Key(prefix, host string) string { return prefix + host }

// Encode is the value stored for a member.
func Encode(m Member) string {
	b, _ := json.Marshal(m)
	return string(b)
}

// Decode parses a stored member and validates it.
func Decode(key string, value []byte) (Member, error) {
	var m Member
	if err := json.Unmarshal(value, &m); err != nil {
		return m, fmt.Errorf("member %s: %w", key, err)
	}
	return m, m.Validate()
}

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

// Describe is a short human summary of a membership ("3 members, 10 slots:
// a:4 b:4 c:2"), for log lines.
func Describe(ms []Member) string {
	slots := 0
	parts := make([]string, len(ms))
	for i, m := range ms {
		slots += m.Slots
		parts[i] = fmt.Sprintf("%s:%d", m.Host, m.Slots)
	}
	s := fmt.Sprintf("%d members, %d slots", len(ms), slots)
	if len(ms) > 0 && len(ms) <= 16 {
		s += ": " + strings.Join(parts, " ")
	}
	return s
}

// Diff names who joined and who left between two memberships.
func Diff(before, after []Member) (joined, left []string) {
	b := map[string]bool{}
	for _, m := range before {
		b[m.Host] = true
	}
	a := map[string]bool{}
	for _, m := range after {
		a[m.Host] = true
		if !b[m.Host] {
			joined = append(joined, m.Host)
		}
	}
	for _, m := range before {
		if !a[m.Host] {
			left = append(left, m.Host)
		}
	}
	return joined, left
}

// SameJob checks that host is a pod of the job that self is a pod of: both are
// stable pod names under the job's headless Service, <name>.<job>.<ns>.svc..., so
// host is self with its first label replaced. The cluster's DNS answers such a
// name only for a pod the job's own Service selects (its labels), which no Role of
// the job lets anyone write; a store a job's pod may carry its trainer's
// connections to is found under such a name, never at an address someone wrote.
func SameJob(self, host string) error {
	if err := ValidateHost(host); err != nil {
		return err
	}
	_, suffix, ok := strings.Cut(strings.TrimSuffix(self, "."), ".")
	if !ok || !strings.Contains(suffix, ".") {
		return fmt.Errorf("this pod's name %q is not a pod name under a job's Service (<name>.<job>.<namespace>.svc...)", self)
	}
	label, rest, ok := strings.Cut(strings.TrimSuffix(host, "."), ".")
	if !ok || label == "" || !strings.EqualFold(rest, suffix) {
		return fmt.Errorf("%q is not a pod of this pod's job (a name <pod>.%s)", host, suffix)
	}
	return nil
}
