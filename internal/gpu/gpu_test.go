package gpu

import (
	"errors"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func container(limits, requests map[string]string) *corev1.Container {
	c := &corev1.Container{Name: "train"}
	conv := func(m map[string]string) corev1.ResourceList {
		if m == nil {
			return nil
		}
		l := corev1.ResourceList{}
		for k, v := range m {
			l[corev1.ResourceName(k)] = resource.MustParse(v)
		}
		return l
	}
	c.Resources.Limits = conv(limits)
	c.Resources.Requests = conv(requests)
	return c
}

func TestSlots(t *testing.T) {
	extra := []string{"example.com/tpu"}
	cases := map[string]struct {
		c     *corev1.Container
		want  int
		mixed bool
	}{
		"cpu only":                 {c: container(map[string]string{"cpu": "4", "memory": "1Gi"}, nil), want: 1},
		"no resources":             {c: container(nil, nil), want: 1},
		"nvidia limit":             {c: container(map[string]string{"nvidia.com/gpu": "4", "cpu": "8"}, nil), want: 4},
		"request only":             {c: container(nil, map[string]string{"amd.com/gpu": "2"}), want: 2},
		"limit wins over request":  {c: container(map[string]string{"nvidia.com/gpu": "8"}, map[string]string{"nvidia.com/gpu": "2"}), want: 8},
		"mig slice":                {c: container(map[string]string{"nvidia.com/mig-1g.10gb": "3"}, nil), want: 3},
		"intel i915":               {c: container(map[string]string{"gpu.intel.com/i915": "2", "gpu.intel.com/millicores": "200", "gpu.intel.com/memory.max": "1G"}, nil), want: 2},
		"intel xe":                 {c: container(map[string]string{"gpu.intel.com/xe": "1"}, nil), want: 1},
		"gaudi":                    {c: container(map[string]string{"habana.ai/gaudi": "8"}, nil), want: 8},
		"neuron":                   {c: container(map[string]string{"aws.amazon.com/neuron": "16"}, nil), want: 16},
		"neuroncore":               {c: container(map[string]string{"aws.amazon.com/neuroncore": "2"}, nil), want: 2},
		"extra name from flag":     {c: container(map[string]string{"example.com/tpu": "4"}, nil), want: 4},
		"zero gpu is cpu-only":     {c: container(map[string]string{"nvidia.com/gpu": "0"}, nil), want: 1},
		"unknown resource ignored": {c: container(map[string]string{"example.com/fpga": "2"}, nil), want: 1},
		"two kinds":                {c: container(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/mig-2g.20gb": "1"}, nil), mixed: true},
		"two vendors":              {c: container(map[string]string{"amd.com/gpu": "1", "habana.ai/gaudi": "1"}, nil), mixed: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Slots(tc.c, extra)
			if tc.mixed {
				var me *MixedError
				require.True(t, errors.As(err, &me), "want MixedError, got %v", err)
				assert.Contains(t, err.Error(), "more than one kind")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestIsAccelerator(t *testing.T) {
	for _, n := range []string{"nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "amd.com/gpu", "gpu.intel.com/i915", "habana.ai/gaudi", "aws.amazon.com/neuron"} {
		assert.True(t, IsAccelerator(corev1.ResourceName(n), nil), n)
	}
	for _, n := range []string{"cpu", "memory", "nvidia.com/mig-", "gpu.intel.com/", "gpu.intel.com/tiles", "ephemeral-storage"} {
		assert.False(t, IsAccelerator(corev1.ResourceName(n), nil), n)
	}
}

// FuzzAccelerators: Accelerators gives what its first, map-based version
// gave: per accelerator resource its limit, or its request when it has no
// limit, without zeros, sorted by name.
func FuzzAccelerators(f *testing.F) {
	f.Add(uint8(0b1011), int8(4), int8(2), int8(0), int8(8))
	f.Add(uint8(0b1111), int8(0), int8(3), int8(1), int8(-1))
	f.Fuzz(func(t *testing.T, present uint8, limGPU, reqGPU, limMIG, reqMIG int8) {
		extra := []string{"example.com/tpu"}
		c := &corev1.Container{}
		set := func(l *corev1.ResourceList, bit uint, name string, v int8) {
			if present&(1<<bit) == 0 {
				return
			}
			if *l == nil {
				*l = corev1.ResourceList{"cpu": resource.MustParse("1")}
			}
			(*l)[corev1.ResourceName(name)] = *resource.NewQuantity(int64(v), resource.DecimalSI)
		}
		set(&c.Resources.Limits, 0, "nvidia.com/gpu", limGPU)
		set(&c.Resources.Requests, 1, "nvidia.com/gpu", reqGPU)
		set(&c.Resources.Limits, 2, "nvidia.com/mig-1g.10gb", limMIG)
		set(&c.Resources.Requests, 3, "nvidia.com/mig-1g.10gb", reqMIG)
		set(&c.Resources.Limits, 4, "example.com/tpu", limGPU^reqMIG)
		set(&c.Resources.Requests, 5, "example.com/tpu", reqGPU^limMIG)
		set(&c.Resources.Requests, 6, "amd.com/gpu", limGPU)

		seen := map[corev1.ResourceName]int64{}
		for name, q := range c.Resources.Requests {
			if IsAccelerator(name, extra) {
				seen[name] = q.Value()
			}
		}
		for name, q := range c.Resources.Limits {
			if IsAccelerator(name, extra) {
				seen[name] = q.Value()
			}
		}
		var want []Count
		for name, v := range seen {
			if v > 0 {
				want = append(want, Count{Resource: name, Value: v})
			}
		}
		sort.Slice(want, func(i, j int) bool { return want[i].Resource < want[j].Resource })
		assert.Equal(t, want, Accelerators(c, extra))
	})
}
