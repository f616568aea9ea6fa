package helm_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// hang.enabled and hang.timeout, from the chart through the webhook to the serving sidecar's flags; the default
// renders no annotation, so that a default job needs no newer webhook.
func TestHangValues(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, tc := range []struct {
		name       string
		hang       map[string]any
		annotation string
		flag       string
	}{
		{"the default: the sidecar's rule", nil, "", ""},
		{"off", map[string]any{"enabled": false}, "off", "--hang=false"},
		{"a timeout", map[string]any{"timeout": 30}, "30", "--hang-timeout=30s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := map[string]any{"command": []any{"torchrun", "train.py"}, "workers": map[string]any{"replicas": 2}}
			if tc.hang != nil {
				vals["hang"] = tc.hang
			}
			pod := renderedServingPod(t, ch, vals)
			require.Equal(t, tc.annotation, pod.Annotations[constants.AnnotationHangTimeout])
			sc, _ := injectedSidecar(t, pod, naming.DefaultClusterDomain)
			args := sc.Args
			require.NotEmpty(t, args)
			got := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return !strings.HasPrefix(a, "--hang") })
			if tc.flag == "" {
				require.Empty(t, got)
			} else {
				require.Equal(t, []string{tc.flag}, got)
			}
		})
	}
}

// checkpoint.replicas, from the chart through the webhook to the sidecar's --checkpoint-replicas; the default (1)
// renders no annotation.
func TestCheckpointReplicas(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, tc := range []struct {
		replicas   int
		annotation string
		flag       []string
	}{{1, "", []string{}}, {2, "2", []string{"--checkpoint-replicas=2"}}, {0, "0", []string{"--checkpoint-replicas=0"}}} {
		t.Run(strconv.Itoa(tc.replicas), func(t *testing.T) {
			pod := renderedServingPod(t, ch, map[string]any{"command": []any{"torchrun", "train.py"},
				"checkpoint": map[string]any{"memory": "1Gi", "replicas": tc.replicas}})
			require.Equal(t, tc.annotation, pod.Annotations[constants.AnnotationCheckpointReplicas])
			sc, _ := injectedSidecar(t, pod, naming.DefaultClusterDomain)
			got := slices.DeleteFunc(slices.Clone(sc.Args), func(a string) bool { return !strings.HasPrefix(a, "--checkpoint-replicas") })
			require.Equal(t, tc.flag, got)
		})
	}
}
