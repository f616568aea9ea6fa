package helm_test

import (
	"slices"
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
