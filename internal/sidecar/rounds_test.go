package sidecar

import (
	"encoding/base64"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestRoundFromEvent(t *testing.T) {
	tests := map[string]struct {
		key, value string
		want       Round
		ok         bool
	}{
		"etcd backend final state": {
			key:   "/torchelastic/p2p/run_job-1/rdzv/active_version",
			value: `{"status": "final", "version": "3", "participants": [0, 1, 2], "keep_alives": [], "num_workers_waiting": 0}`,
			want:  Round{Backend: "etcd", RunID: "job-1", Round: "3", Participants: 3}, ok: true,
		},
		"etcd backend joinable state is not a round": {
			key:   "/torchelastic/p2p/run_job-1/rdzv/active_version",
			value: `{"status": "joinable", "version": "3", "participants": [0]}`,
		},
		"etcd backend garbage": {key: "/x/run_a/rdzv/active_version", value: `{`},
		"etcd-v2 backend MASTER_ADDR": {
			key:   "/torch/elastic/store/" + b64("torch.rendezvous.my.run.id.2/MASTER_ADDR"),
			value: b64("worker-0.job.ns.svc"),
			want:  Round{Backend: "etcd-v2", RunID: "my.run.id", Round: "2", Participants: -1, Master: "worker-0.job.ns.svc"}, ok: true,
		},
		"etcd-v2 other store key": {key: "/torch/elastic/store/" + b64("torch.rendezvous.r.0/MASTER_PORT"), value: b64("1")},
		"etcd-v2 bad base64":      {key: "/torch/elastic/store/%%%", value: ""},
		"unrelated key":           {key: "/k", value: "v"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := roundFromEvent(tt.key, tt.value)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("roundFromEvent (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRoundFromC10dKey(t *testing.T) {
	got, ok := roundFromStoreKey("c10d", "torch.rendezvous.my.run.4/MASTER_ADDR", "w-0.job.ns.svc")
	if !ok {
		t.Fatal("MASTER_ADDR of a round not recognised")
	}
	if diff := cmp.Diff(Round{Backend: "c10d", RunID: "my.run", Round: "4", Participants: -1, Master: "w-0.job.ns.svc"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, key := range []string{"torch.rendezvous.r.0/MASTER_PORT", "torch.rendezvous.r", "other/MASTER_ADDR", "torch.rendezvous.norounddot/MASTER_ADDR"} {
		if _, ok := roundFromStoreKey("c10d", key, ""); ok {
			t.Errorf("%q taken for a round", key)
		}
	}
}
