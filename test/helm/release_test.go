package helm_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart/loader"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// The release workflow cannot run here (no registry, no GitHub): TestReleaseWorkflow lints it with actionlint and
// shellcheck (hack/lint-workflows.sh), and checks what ties it to the charts: it builds exactly the images the
// charts name, with the tag the charts default to.
func TestReleaseWorkflow(t *testing.T) {
	root := testenv.RepoRoot()
	lint := func(files ...string) ([]byte, error) {
		cmd := exec.Command("bash", append([]string{filepath.Join(root, "hack", "lint-workflows.sh")}, files...)...)
		cmd.Dir = root
		return cmd.CombinedOutput()
	}
	out, err := lint()
	require.NoError(t, err, "hack/lint-workflows.sh:\n%s", out)

	// The lint can fail: an unknown context and a shell bug are both reported.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n"+
		"      - run: echo ${{ github.no_such_thing }}\n      - run: cd $DIR\n"), 0o644))
	out, err = lint(bad)
	require.Error(t, err)
	assert.Contains(t, string(out), "no_such_thing")
	assert.Contains(t, string(out), "shellcheck")

	var wf struct {
		Env  map[string]string `json:"env"`
		Jobs map[string]struct {
			Strategy struct {
				Matrix struct {
					Image []string `json:"image"`
				} `json:"matrix"`
			} `json:"strategy"`
			Steps []struct {
				Uses string            `json:"uses"`
				With map[string]string `json:"with"`
				Run  string            `json:"run"`
			} `json:"steps"`
		} `json:"jobs"`
	}
	b, err := os.ReadFile(filepath.Join(root, ".github", "workflows", "release.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &wf))
	var built, packaged []string
	for _, name := range wf.Jobs["images"].Strategy.Matrix.Image {
		// build/<image>.Dockerfile builds ./cmd/<image>.
		df, err := os.ReadFile(filepath.Join(root, "build", name+".Dockerfile"))
		require.NoError(t, err)
		require.Contains(t, string(df), "./cmd/"+name+"\n", "build/%s.Dockerfile builds ./cmd/%s", name, name)
		built = append(built, wf.Env["REGISTRY"]+"/"+name)
	}
	pushed := false
	for _, step := range wf.Jobs["images"].Steps {
		if strings.HasPrefix(step.Uses, "docker/build-push-action@") {
			pushed = true
			assert.Equal(t, "linux/amd64,linux/arm64", step.With["platforms"], "multi-arch images")
			assert.Equal(t, "build/${{ matrix.image }}.Dockerfile", step.With["file"])
			assert.Equal(t, "${{ env.REGISTRY }}/${{ matrix.image }}:${{ steps.version.outputs.version }}", step.With["tags"],
				"images tagged with the version, as the charts' appVersion")
		}
	}
	require.True(t, pushed, "the images job builds with docker/build-push-action")
	for _, step := range wf.Jobs["charts"].Steps {
		if strings.Contains(step.Run, "helm package") {
			require.Contains(t, step.Run, `--version "$v" --app-version "$v"`, "charts versioned like the images")
			packaged = regexp.MustCompile(`charts/[a-z0-9-]+`).FindAllString(step.Run, -1)
		}
	}
	charts, _ := filepath.Glob(filepath.Join(root, "charts", "*", "Chart.yaml"))
	var want []string
	for _, c := range charts {
		want = append(want, "charts/"+filepath.Base(filepath.Dir(c)))
	}
	assert.ElementsMatch(t, want, packaged, "the workflow packages every chart")

	// Every image of ours the charts render by default, with the tag each chart defaults to: its appVersion.
	var images []string
	for _, c := range []struct {
		name   string
		values map[string]any
	}{
		{"elastic-training", map[string]any{"command": []any{"torchrun", "train.py"}, "rendezvous": map[string]any{"placement": "dedicated"}}},
		{"elastic-training-webhook", map[string]any{"tls": map[string]any{"certManager": map[string]any{"enabled": true}}}},
	} {
		ch, err := loader.Load(chartrender.Dir(c.name))
		require.NoError(t, err)
		r, err := chartrender.Render(ch, c.values, chartrender.Options{Release: "rel", Namespace: "ns"})
		require.NoError(t, err, c.name)
		for _, o := range r.Objects {
			for _, m := range regexp.MustCompile(`(?m)(?:image: |--sidecar-image=)"?(ghcr\.io/elastic-training/[^"\s]+)`).FindAllStringSubmatch(o.YAML, -1) {
				repo, tag, _ := strings.Cut(m[1], ":")
				assert.Equal(t, ch.Metadata.AppVersion, tag, "%s: %s in %s", c.name, m[1], o.Key())
				if !slices.Contains(images, repo) {
					images = append(images, repo)
				}
			}
		}
	}
	require.NotEmpty(t, built, "no ko build of ./cmd/... in the images job")
	assert.ElementsMatch(t, built, images, "the workflow builds (left) every image the charts use by default (right)")
}
