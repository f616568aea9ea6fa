package helm_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// The data volume against the StorageClass the cluster gives it, read at install: what used to render and fail at
// runtime (Multi-Attach on the second node) or stay Pending without a word is refused with the class to use.
func TestSharedVolumeClass(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	class := func(name, provisioner string, isDefault bool) map[string]any {
		md := map[string]any{"name": name}
		if isDefault {
			md["annotations"] = map[string]any{"storageclass.kubernetes.io/is-default-class": "true"}
		}
		return map[string]any{"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": md, "provisioner": provisioner}
	}
	eks := []map[string]any{class("gp3", "ebs.csi.aws.com", true), class("efs", "efs.csi.aws.com", false)}
	local := []map[string]any{class("local-path", "rancher.io/local-path", true)}
	base := merge(pinned(t), map[string]any{"command": []any{"torchrun", "train.py"},
		"workers": map[string]any{"replicas": 2, "minReplicas": 1, "maxReplicas": 4}})
	for name, c := range map[string]struct {
		cluster     []map[string]any
		persistence map[string]any
		nodeSel     map[string]any
		want        string // "": accepted
	}{
		"ReadWriteMany from EBS, the default class": {eks, map[string]any{"enabled": true}, nil,
			"persistence.accessModes: ReadWriteMany from StorageClass gp3 (the cluster's default, provisioner ebs.csi.aws.com) stays Pending: that provisioner makes volumes that one node mounts. Set persistence.storageClassName to a class that gives ReadWriteMany (Amazon EFS: efs.csi.aws.com"},
		"ReadWriteMany from EFS, named": {eks, map[string]any{"enabled": true, "storageClassName": "efs"}, nil, ""},
		"ReadWriteOnce from EBS across nodes": {eks, map[string]any{"enabled": true, "accessModes": []any{"ReadWriteOnce"}}, nil,
			"persistence.accessModes: ReadWriteOnce from StorageClass gp3 (the cluster's default, provisioner ebs.csi.aws.com) attaches the data volume to one node, and this job's pods (up to 4) may run on several, where the others fail with Multi-Attach"},
		"ReadWriteOnce from EBS, every pod on one node": {eks, map[string]any{"enabled": true, "accessModes": []any{"ReadWriteOnce"}},
			map[string]any{"kubernetes.io/hostname": "gpu-1"}, ""},
		"ReadWriteOnce from a local path (the pods follow the volume's node)": {local, map[string]any{"enabled": true, "accessModes": []any{"ReadWriteOnce"}}, nil, ""},
		"ReadWriteMany from a local path":                                     {local, map[string]any{"enabled": true}, nil, "ReadWriteMany from StorageClass local-path (the cluster's default, provisioner rancher.io/local-path) stays Pending"},
		"an existing claim":                                                   {eks, map[string]any{"enabled": true, "existingClaim": "datasets"}, nil, ""},
		"no cluster to read (helm template)":                                  {nil, map[string]any{"enabled": true, "accessModes": []any{"ReadWriteOnce"}}, nil, ""},
		"no check (no permission to list StorageClasses)":                     {eks, map[string]any{"enabled": true, "checkStorageClass": false}, nil, ""},
	} {
		t.Run(name, func(t *testing.T) {
			v := merge(base, map[string]any{"persistence": c.persistence})
			if c.nodeSel != nil {
				v["nodeSelector"] = c.nodeSel
			}
			_, err := render(ch, v, chartrender.Options{Cluster: c.cluster})
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, c.want)
		})
	}
}
