package helm_test

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// TestExamplesRunAsWritten renders every example for real clusters (examples/*.yaml) as its usage line installs it,
// --set-file included, and checks that each program file a training container runs is there: a script the chart
// mounts (in the script ConfigMap it renders), a file the sidecar writes (/etc/elastic-training/), a file of the
// image that the example names next to it ("In the image <image>: <path>", with where that image gets it), or one of
// the node's that it names ("From the node: <path>", under a hostPath volume the container mounts). The
// images of these examples cannot be pulled here; the examples under examples/local run for real in test/e2e.
func TestExamplesRunAsWritten(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	paths, _ := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	require.NotEmpty(t, paths)
	file := regexp.MustCompile(`(?:^|[\s"'=])(/[\w./-]+\.(?:py|sh))\b`)
	for _, path := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".yaml"), func(t *testing.T) {
			raw, err := os.ReadFile(path)
			require.NoError(t, err)
			usage := chartrender.Usage(string(raw))
			require.NotEmpty(t, usage, "no `# helm install ...` usage line")
			rel := "examples/" + filepath.Base(path)
			assert.Contains(t, usage+" ", " -f "+rel+" ", "the usage installs this file, from the repository's root")
			sets, err := chartrender.UsageSetFiles(path)
			require.NoError(t, err)
			r, err := render(ch, merge(chartrender.ReadValues(t, path), pinned(t)), chartrender.Options{})
			require.NoError(t, err, "helm install as the usage says: %s", usage)

			mounted := map[string]bool{}
			if cm := r.Find("ConfigMap", release+"-script"); cm != nil {
				data, _ := cm.Object["data"].(map[string]any)
				for name := range data {
					mounted["/etc/elastic-training-script/"+name] = true
				}
			}
			if len(sets) > 0 {
				assert.NotEmpty(t, mounted, "the usage gives %v, and no script is mounted", sets)
			}
			checked := 0
			for key, spec := range podSpecs(t, r) {
				for _, c := range spec.Spec.Containers {
					argv := strings.Join(append(append([]string{}, c.Command...), c.Args...), " ")
					if strings.Contains(c.Image, "/rdzv-sidecar") || argv == "" {
						continue
					}
					for _, m := range file.FindAllStringSubmatch(argv, -1) {
						p := m[1]
						checked++
						switch {
						case mounted[p]:
						case strings.HasPrefix(p, "/etc/elastic-training/"):
							// Written by the rendezvous sidecar (hostfile, discover_hosts.sh: docs/contract.md).
						case strings.Contains(string(raw), "In the image "+c.Image+": "+p):
						case strings.Contains(string(raw), "From the node: "+p) && underHostPath(spec.Spec, c, p):
						default:
							t.Errorf("%s container %s (image %s) runs %s: neither a script the chart mounts (%v) nor a file the example says its image has (a comment \"In the image %s: %s\" naming where the image gets it)",
								key, c.Name, c.Image, p, slices.Sorted(maps.Keys(mounted)), c.Image, p)
						}
					}
				}
			}
			assert.NotZero(t, checked, "no program file found in the example's containers: give the script's path")
		})
	}
}

// underHostPath: p lies under a mount of c whose volume is a hostPath.
func underHostPath(spec corev1.PodSpec, c corev1.Container, p string) bool {
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil && strings.HasPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/") {
				return true
			}
		}
	}
	return false
}
