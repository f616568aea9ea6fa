package mutate

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
// ends and the serving sidecar drops it from the round (internal/survivors);
// torch's own timeout, interval × max attempts, is the fallback.
func KeepAliveInterval(configured, maxNodes int) int {
	return max(configured, (maxNodes+maxHeartbeatsPerSecond-1)/maxHeartbeatsPerSecond)
}
