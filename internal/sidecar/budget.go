package sidecar

import (
	"fmt"

	"github.com/elastic-training/elastic-training/internal/membudget"
	"github.com/elastic-training/elastic-training/internal/tcpstore"
)

// applyBudget gives every quota that no flag set its share of the container's memory limit (internal/membudget):
// all of them full at once, with the job's own state beside them, stay under the limit. A limit too small to
// leave the clients anything is refused with the figures.
func (c *ServeConfig) applyBudget() error {
	b, err := membudget.Split(c.MemoryLimit, c.Checkpoint.Share(), c.legacyV2())
	if err != nil {
		return fmt.Errorf("memory budget: %w", err)
	}
	d := tcpstore.QuotasFor(b.C10dStore, b.C10dWaits, b.C10dReplies, b.C10dConns)
	q := &c.C10dQuotas
	q.Bytes, q.WaitBytes, q.ReplyBytes = orDefault(q.Bytes, d.Bytes), orDefault(q.WaitBytes, d.WaitBytes), orDefault(q.ReplyBytes, d.ReplyBytes)
	q.Connections = orDefault(q.Connections, d.Connections)
	l := &c.V2Limits
	l.MaxBytes, l.MaxReplyBytes = orDefault(l.MaxBytes, b.V2Store), orDefault(l.MaxReplyBytes, b.V2Replies)
	c.Etcd.Limits = b.EtcdLimits()
	e := c.Etcd.Limits
	c.Log.Info("memory budget", "budget", b.String(), "c10d_max_bytes", q.Bytes, "c10d_max_waiting_bytes", q.WaitBytes,
		"c10d_max_reply_bytes", q.ReplyBytes, "c10d_max_connections", q.Connections, "v2_max_bytes", l.MaxBytes, "v2_max_reply_bytes", l.MaxReplyBytes,
		"etcd_max_request_bytes", e.MaxRequestBytes, "etcd_snapshot_count", e.SnapshotCount)
	return nil
}

func orDefault[T int | int64](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}
