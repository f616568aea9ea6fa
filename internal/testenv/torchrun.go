package testenv

import (
	"slices"
	"strings"
)

// TorchrunArgs are torchrun's arguments for one agent of the run runID
// through the rendezvous endpoint (host:port), one process per node, then
// extra. On c10d the store is the sidecar's and no agent may host one, so
// is_host=false joins the --rdzv_conf of extra (or is one), as the webhook
// sets it.
func TorchrunArgs(backend, endpoint, runID, nnodes string, extra ...string) []string {
	if backend == "c10d" {
		conf := slices.IndexFunc(extra, func(a string) bool { return strings.HasPrefix(a, "--rdzv_conf=") })
		if conf < 0 {
			extra = append(slices.Clip(extra), "--rdzv_conf=is_host=false")
		} else {
			extra = slices.Clone(extra)
			extra[conf] += ",is_host=false"
		}
	}
	return append([]string{"--nnodes=" + nnodes, "--nproc_per_node=1", "--rdzv_backend=" + backend,
		"--rdzv_endpoint=" + endpoint, "--rdzv_id=" + runID, "--monitor_interval=1"}, extra...)
}
