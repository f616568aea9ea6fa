// Package torchbackends is the boundary of what the rendezvous sidecar does only for torch's own rendezvous
// backends (torchrun --rdzv-backend c10d, etcd, etcd-v2), which the elastic-training backend (the default,
// internal/rdzv) needs none of. Its packages are wired only when a job uses one of them (rdzv-sidecar serve
// --backend):
//
//   - torchstate: torch's pickled dynamic-rendezvous state, read for the view and written back with a node more or
//     less on the wait list;
//   - torchrounds: their rounds and state for the view (internal/torchview), from their stores' writes;
//   - torchleave: the preStop hook's half that takes a stopping agent out of their rendezvous (leave_torch.py);
//   - survivors: the restart of torch's survivors when a participant's pod leaves the membership (c10d);
//   - v2api: the etcd v2 keys API over etcd's v2 store, which python-etcd speaks (etcd-v2, and torch 2.4/2.5's
//     quirks).
//
// The view of the rounds (internal/torchview) serves every backend and parses no backend's keys.
package torchbackends
