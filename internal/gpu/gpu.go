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

// Known accelerator resource names (exact matches).
var exactNames = map[corev1.ResourceName]bool{
	"nvidia.com/gpu":              true,
	"amd.com/gpu":                 true,
	"habana.ai/gaudi":             true,
	"aws.amazon.com/neuron":       true, // Neuron device plugin: whole devices
	"aws.amazon.com/neurondevice": true,
	"aws.amazon.com/neuroncore":   true, // Neuron device plugin: individual cores
}

// intelNonDevice are gpu.intel.com/* resources that are not devices but
// shares of one (the Intel GPU plugin's resource management mode).
var intelNonDevice = map[string]bool{
	"millicores": true,
	"tiles":      true,
}

// IsAccelerator reports whether name is an accelerator resource: a known
// vendor name, an NVIDIA MIG slice (nvidia.com/mig-*), an Intel GPU
// (gpu.intel.com/* except millicores, tiles and memory.*), or one of extra.
func IsAccelerator(name corev1.ResourceName, extra []string) bool {
	if exactNames[name] {
		return true
	}
	s := string(name)
	if strings.HasPrefix(s, "nvidia.com/mig-") && len(s) > len("nvidia.com/mig-") {
		return true
	}
	if rest, ok := strings.CutPrefix(s, "gpu.intel.com/"); ok && rest != "" {
		return !intelNonDevice[rest] && !strings.HasPrefix(rest, "memory.")
	}
	for _, e := range extra {
		if s == e {
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
