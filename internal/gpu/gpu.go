// Package gpu counts the accelerators a container asks for, so that one
// number (the pod's slot count) drives torchrun's --nproc-per-node, the
// hostfile's slots= and every world-size value.
package gpu

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Rules are the accelerator resource names, as data: IsAccelerator applies
// them, and the job chart checks its gpuResource value against the same
// data (internal/chartcontract generates it into the chart).
var Rules = struct {
	// Exact names, sorted.
	Exact []string `json:"exact"`
	// Prefixes: any name with one of them and something after it.
	Prefixes []string `json:"prefixes"`
	// Shares: names under a prefix that are not devices but shares of one
	// (the Intel GPU plugin's resource management: millicores, tiles,
	// memory.*): the full name, or a prefix when it ends in ".".
	Shares []string `json:"shares"`
}{
	Exact: []string{
		"amd.com/gpu",
		"aws.amazon.com/neuron",     // Neuron device plugin: whole devices
		"aws.amazon.com/neuroncore", // Neuron device plugin: individual cores
		"aws.amazon.com/neurondevice",
		"habana.ai/gaudi",
		"nvidia.com/gpu",
	},
	Prefixes: []string{"gpu.intel.com/", "nvidia.com/mig-"},
	Shares:   []string{"gpu.intel.com/memory.", "gpu.intel.com/millicores", "gpu.intel.com/tiles"},
}

// IsAccelerator reports whether name is an accelerator resource by Rules,
// or one of extra.
func IsAccelerator(name corev1.ResourceName, extra []string) bool {
	s := string(name)
	if slices.Contains(Rules.Exact, s) || slices.Contains(extra, s) {
		return true
	}
	for _, sh := range Rules.Shares {
		if s == sh || strings.HasSuffix(sh, ".") && strings.HasPrefix(s, sh) {
			return false
		}
	}
	for _, p := range Rules.Prefixes {
		if strings.HasPrefix(s, p) && len(s) > len(p) {
			return true
		}
	}
	return false
}

// Count is what a container asks for of one accelerator resource.
type Count struct {
	Resource corev1.ResourceName
	Value    int64
}

// Accelerators lists the accelerator resources of c with a non-zero count,
// sorted by name. A resource's count is its limit, or its request when it
// has no limit (extended resources must have limit == request anyway).
func Accelerators(c *corev1.Container, extra []string) []Count {
	// A container asks for one or two kinds at most: a list searched in
	// order is cheaper than a map.
	var out []Count
	for name, q := range c.Resources.Limits {
		if IsAccelerator(name, extra) {
			out = append(out, Count{Resource: name, Value: q.Value()})
		}
	}
	for name, q := range c.Resources.Requests {
		if _, limited := c.Resources.Limits[name]; !limited && IsAccelerator(name, extra) {
			out = append(out, Count{Resource: name, Value: q.Value()})
		}
	}
	if out = slices.DeleteFunc(out, func(c Count) bool { return c.Value <= 0 }); len(out) == 0 {
		return nil
	}
	slices.SortFunc(out, func(a, b Count) int { return strings.Compare(string(a.Resource), string(b.Resource)) })
	return out
}

// MixedError says a container asks for more than one kind of accelerator, so
// the number of processes per pod is ambiguous.
type MixedError struct{ Counts []Count }

func (e *MixedError) Error() string {
	parts := make([]string, len(e.Counts))
	for i, c := range e.Counts {
		parts[i] = fmt.Sprintf("%s=%d", c.Resource, c.Value)
	}
	return "container asks for more than one kind of accelerator (" + strings.Join(parts, ", ") + ")"
}

// Slots returns the slot count of a container: the count of its one kind of
// accelerator, or 1 when it has none (a CPU-only member runs one process).
//
// A container that asks for two or more kinds of accelerator (for example
// nvidia.com/gpu and a MIG slice, or aws.amazon.com/neuron and
// aws.amazon.com/neuroncore) has no obvious process count: Slots returns a
// *MixedError rather than guess, and the caller asks the user to state the
// count explicitly (the elastic-training.io/slots annotation).
func Slots(c *corev1.Container, extra []string) (int, error) {
	counts := Accelerators(c, extra)
	switch len(counts) {
	case 0:
		return 1, nil
	case 1:
		return int(counts[0].Value), nil
	default:
		return 0, &MixedError{Counts: counts}
	}
}
