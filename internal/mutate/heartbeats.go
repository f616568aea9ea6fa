package mutate

import "math"

// maxHeartbeatsPerSecond bounds the rate of torch's rendezvous heartbeats a
// job plans for. Each heartbeat of torch's dynamic rendezvous rewrites the
// whole pickled state (every node, every heartbeat time) with one
// compare-and-set on one key, so with N nodes at interval i the store sees
// N/i writes a second, each a few hundred bytes per node, and a write that
// loses the race is read, unpickled and tried again. Past a rate the nodes
// cannot keep up with, torch drops nodes whose heartbeat is older than
// interval × max attempts, they join again and the round never forms:
// `make bench-scale` (256 nodes: keep_alive_interval 2 and 4 never formed
// in 90 s, 5 formed in 18 s, 8 in 10 s).
const maxHeartbeatsPerSecond = 32

// KeepAliveInterval is torch's keep_alive_interval for a job of up to
// maxNodes: the configured seconds, or longer for a large job, so that its
// heartbeats stay under maxHeartbeatsPerSecond (1,024 nodes: 32 s). A lost
// node is still noticed within seconds on c10d: its pod's membership lease
// ends and the serving sidecar drops it from the round (internal/torchbackends/survivors);
// torch's own timeout, interval × max attempts, is the fallback.
func KeepAliveInterval(configured, maxNodes int) int {
	return max(configured, (maxNodes+maxHeartbeatsPerSecond-1)/maxHeartbeatsPerSecond)
}

// Bounds of torchrun's --monitor-interval the webhook accepts, in seconds.
const (
	MinMonitorInterval = 0.1
	MaxMonitorInterval = 3600
)

// maxWaitingChecksPerSecond bounds how often a job's agents ask the store
// for waiting nodes. Every agent calls num_nodes_waiting once per monitor
// interval while its workers run; with the elastic-training backend and etcd each call
// reads the store (torch's c10d caches its state for 1 s). 4,096 a second is
// what a 4,096-node job asked at the chart's earlier 1 s, whose steady server
// CPU `make bench-scale` measured at 0.35 cores.
const maxWaitingChecksPerSecond = 4096

// MonitorInterval is torchrun's --monitor-interval for a job of up to
// maxNodes when the job sets none: the configured seconds (torch's own 0.1),
// or longer for a large job, so that its checks stay under
// maxWaitingChecksPerSecond (1,024 nodes: 0.25 s; 4,096: 1 s). The interval
// is how long a running agent can take to see a node waiting: a scale-up, a
// lost node, a failed peer.
func MonitorInterval(configured float64, maxNodes int) float64 {
	scaled := math.Ceil(float64(maxNodes)*100/maxWaitingChecksPerSecond) / 100
	return max(configured, scaled)
}
