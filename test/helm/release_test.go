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
	"helm.sh/helm/v3/pkg/chart"
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

	wf := readReleaseWorkflow(t)
	var built, packaged []string
	for _, name := range wf.Jobs["images"].Strategy.Matrix.Image {
		// build/<image>.Dockerfile builds ./cmd/<image>.
		df, err := os.ReadFile(filepath.Join(root, "build", name+".Dockerfile"))
		require.NoError(t, err)
		require.Contains(t, string(df), "./cmd/"+name+"\n", "build/%s.Dockerfile builds ./cmd/%s", name, name)
		built = append(built, wf.Env["REGISTRY"]+"/"+name)
	}
	pushed, signed := "", false
	for _, step := range wf.Jobs["images"].Steps {
		if strings.HasPrefix(step.Uses, "docker/build-push-action@") {
			pushed = step.ID
			assert.Equal(t, "linux/amd64,linux/arm64", step.With["platforms"], "multi-arch images")
			assert.Equal(t, "build/${{ matrix.image }}.Dockerfile", step.With["file"])
			assert.Equal(t, "${{ env.REGISTRY }}/${{ matrix.image }}:${{ steps.version.outputs.version }}", step.With["tags"],
				"images tagged with the version, as the charts' appVersion")
			assert.Equal(t, "true", step.With["sbom"], "an SBOM attached to every image")
			assert.Equal(t, "mode=max", step.With["provenance"], "build provenance attached to every image")
		}
		// Signed after the push, by the digest the push gave (a tag can be moved, a digest cannot).
		if pushed != "" && strings.HasPrefix(step.Run, "cosign sign --yes ") {
			signed = true
			assert.Equal(t, `cosign sign --yes "$IMAGE"`, strings.TrimSpace(step.Run))
			assert.Equal(t, "${{ env.REGISTRY }}/${{ matrix.image }}@${{ steps."+pushed+".outputs.digest }}", step.Env["IMAGE"],
				"the image signed is the one pushed, by digest")
		}
	}
	require.NotEmpty(t, pushed, "the images job builds with docker/build-push-action, in a step with an id")
	assert.True(t, signed, "the images job signs each image it pushed (cosign sign, after the push)")
	for _, job := range []string{"images", "charts"} {
		assert.Equal(t, "write", wf.Jobs[job].Permissions["id-token"], "job %s: keyless signing needs the workflow's OIDC token", job)
		assert.True(t, slices.ContainsFunc(wf.Jobs[job].Steps, func(s workflowStep) bool { return strings.HasPrefix(s.Uses, "sigstore/cosign-installer@") }),
			"job %s installs cosign", job)
	}
	for _, step := range wf.Jobs["charts"].Steps {
		if strings.Contains(step.Run, "helm package") {
			require.Contains(t, step.Run, `--version "$v" --app-version "$v"`, "charts versioned like the images")
			packaged = regexp.MustCompile(`charts/[a-z0-9-]+`).FindAllString(step.Run, -1)
			// Each pushed chart is signed by the digest helm push printed.
			require.Regexp(t, `(?s)for pkg in dist/\*\.tgz.*digest=\$\(helm push .*cosign sign --yes "\$\{CHARTS#oci://\}/\$name@\$digest"`, step.Run,
				"the charts job signs every chart it pushes")
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
	for _, name := range []string{"elastic-training", "elastic-training-webhook"} {
		version := chartMetadata(t, name).AppVersion
		for _, ref := range defaultImages(t, name) {
			repo, tag, _ := strings.Cut(ref, ":")
			assert.Equal(t, version, tag, "%s: %s", name, ref)
			if !slices.Contains(images, repo) {
				images = append(images, repo)
			}
		}
	}
	require.NotEmpty(t, built, "no ko build of ./cmd/... in the images job")
	assert.ElementsMatch(t, built, images, "the workflow builds (left) every image the charts use by default (right)")
}

type workflowStep struct {
	ID   string            `json:"id"`
	Uses string            `json:"uses"`
	With map[string]string `json:"with"`
	Env  map[string]string `json:"env"`
	Run  string            `json:"run"`
}

type releaseWorkflow struct {
	Env  map[string]string `json:"env"`
	Jobs map[string]struct {
		Permissions map[string]string `json:"permissions"`
		Strategy    struct {
			Matrix struct {
				Image []string `json:"image"`
			} `json:"matrix"`
		} `json:"strategy"`
		Steps []workflowStep `json:"steps"`
	} `json:"jobs"`
}

func readReleaseWorkflow(t *testing.T) releaseWorkflow {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), ".github", "workflows", "release.yaml"))
	require.NoError(t, err)
	var wf releaseWorkflow
	require.NoError(t, yaml.Unmarshal(b, &wf))
	return wf
}

// TestReleaseVersionStep runs the release workflow's own version step here, as GitHub would on a tag: the tag of
// the charts' version passes and gives the images' version, another tag fails naming the Chart.yaml to bump.
func TestReleaseVersionStep(t *testing.T) {
	var step *workflowStep
	wf := readReleaseWorkflow(t)
	for i, s := range wf.Jobs["images"].Steps {
		if s.ID == "version" {
			step = &wf.Jobs["images"].Steps[i]
		}
	}
	require.NotNil(t, step, "the images job has a step with id version")
	run := func(tag string) (string, string, error) {
		out := filepath.Join(t.TempDir(), "output")
		cmd := exec.Command("bash", "-e", "-c", step.Run)
		cmd.Dir = testenv.RepoRoot()
		cmd.Env = append(os.Environ(), "TAG="+tag, "GITHUB_OUTPUT="+out)
		log, err := cmd.CombinedOutput()
		b, _ := os.ReadFile(out)
		return string(b), string(log), err
	}
	v := chartMetadata(t, "elastic-training").Version
	got, log, err := run("v" + v)
	require.NoError(t, err, log)
	assert.Equal(t, "version="+v+"\n", got)
	got, log, err = run("v9.9.9")
	require.Error(t, err)
	assert.Empty(t, got)
	assert.Contains(t, log, "must carry version 9.9.9")
}

func chartMetadata(t *testing.T, name string) *chart.Metadata {
	t.Helper()
	ch, err := loader.Load(chartrender.Dir(name))
	require.NoError(t, err)
	return ch.Metadata
}

// defaultImages returns every image of ours (ghcr.io/elastic-training/...) that chart renders with its defaults
// (the job chart with a dedicated rendezvous pod, the webhook chart with the sidecar it injects), sorted.
func defaultImages(t *testing.T, name string) []string {
	t.Helper()
	values := map[string]map[string]any{
		"elastic-training":         {"command": []any{"torchrun", "train.py"}, "rendezvous": map[string]any{"placement": "dedicated"}},
		"elastic-training-webhook": {"tls": map[string]any{"certManager": map[string]any{"enabled": true}}},
	}[name]
	ch, err := loader.Load(chartrender.Dir(name))
	require.NoError(t, err)
	r, err := chartrender.Render(ch, values, chartrender.Options{Release: "rel", Namespace: "ns"})
	require.NoError(t, err, name)
	var images []string
	for _, o := range r.Objects {
		for _, m := range regexp.MustCompile(`(?m)(?:image: |--sidecar-image=)"?(ghcr\.io/elastic-training/[^"\s]+)`).FindAllStringSubmatch(o.YAML, -1) {
			if !slices.Contains(images, m[1]) {
				images = append(images, m[1])
			}
		}
	}
	slices.Sort(images)
	return images
}
