package testenv

import (
	"slices"
	"testing"
)

func TestTorchrunArgs(t *testing.T) {
	with := func(backend string, more ...string) []string {
		return append([]string{"--nnodes=2:3", "--nproc_per_node=1", "--rdzv_backend=" + backend,
			"--rdzv_endpoint=h:1", "--rdzv_id=run", "--monitor_interval=1"}, more...)
	}
	for _, c := range []struct {
		name, backend string
		extra, want   []string
	}{
		{"etcd: extra as given", "etcd", []string{"--max_restarts=5"}, with("etcd", "--max_restarts=5")},
		{"c10d without a conf: is_host=false is one", "c10d", []string{"--max_restarts=5"},
			with("c10d", "--max_restarts=5", "--rdzv_conf=is_host=false")},
		{"c10d with a conf: is_host=false joins it", "c10d", []string{"--rdzv_conf=last_call_timeout=2", "--max_restarts=5"},
			with("c10d", "--rdzv_conf=last_call_timeout=2,is_host=false", "--max_restarts=5")},
	} {
		t.Run(c.name, func(t *testing.T) {
			extra := slices.Clone(c.extra)
			if got := TorchrunArgs(c.backend, "h:1", "run", "2:3", extra...); !slices.Equal(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
			if !slices.Equal(extra, c.extra) {
				t.Errorf("extra changed to %q", extra)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	if got := Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("odd count: %v, want 2", got)
	}
	v := []int{4, 1, 3, 2}
	if got := Median(v); got != 3 {
		t.Errorf("even count: %v, want the upper middle 3", got)
	}
	if !slices.Equal(v, []int{4, 1, 3, 2}) {
		t.Errorf("Median sorted its argument: %v", v)
	}
}
