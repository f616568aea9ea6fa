package helm_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

const (
	repoURL = "https://github.com/elastic-training/elastic-training"
	rawURL  = "https://raw.githubusercontent.com/elastic-training/elastic-training/"
)

var charts = []string{"elastic-training", "elastic-training-webhook"}

// TestVersionsMatchChangelog: both charts carry one version, as chart and app version (the release workflow
// refuses a tag of another), and it is the newest release of CHANGELOG.md's compatibility table, whose contract
// columns are what this tree's job chart renders and this tree's webhook serves.
func TestVersionsMatchChangelog(t *testing.T) {
	v := chartMetadata(t, "elastic-training").Version
	for _, name := range charts {
		m := chartMetadata(t, name)
		assert.Equal(t, v, m.Version, "%s: the charts are released together, with one version", name)
		assert.Equal(t, v, m.AppVersion, "%s: appVersion is the release (the images' tag)", name)
	}
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "CHANGELOG.md"))
	require.NoError(t, err)
	changelog := string(b)
	rows := regexp.MustCompile(`(?m)^\| ([^|]+?) \| ([^|]+?) \| ([^|]+?) \|$`).FindAllStringSubmatch(changelog, -1)
	require.GreaterOrEqual(t, len(rows), 2, "CHANGELOG.md: a compatibility table with a header and a release")
	newest := rows[1] // after the header
	assert.Equal(t, v, newest[1], "CHANGELOG.md: the compatibility table's first release is the charts' version")
	assert.Regexp(t, `(?m)^## `+regexp.QuoteMeta(v)+`\b`, changelog, "CHANGELOG.md has a section for %s", v)

	ch := chartrender.Load(t, chartrender.Dir("elastic-training"))
	r, err := chartrender.Render(ch, map[string]any{"command": []any{"torchrun", "train.py"}}, chartrender.Options{Release: "rel", Namespace: "ns"})
	require.NoError(t, err)
	job := r.Find("Job", "rel-worker")
	require.NotNil(t, job)
	contract, _, _ := unstructured.NestedString(job.Object, "spec", "template", "metadata", "annotations", constants.AnnotationContract)
	assert.Equal(t, contract, newest[2], "CHANGELOG.md: the job chart contract of %s is what the chart renders", v)
	assert.Equal(t, strconv.Itoa(constants.ContractVersion), contract)
	var served []string
	for c := 1; c <= constants.ContractVersion; c++ {
		served = append(served, strconv.Itoa(c))
	}
	assert.Equal(t, strings.Join(served, ", "), newest[3], "CHANGELOG.md: the contracts the webhook of %s serves", v)
}

// TestArtifactHubMetadata: what Artifact Hub shows of each chart is true of this tree: the license is LICENSE's,
// the icon is a file of the repository, the images listed (for its security scan) are those the chart renders by
// default, and every link leads to a file and heading of the repository at the release's tag.
func TestArtifactHubMetadata(t *testing.T) {
	root := testenv.RepoRoot()
	license, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	require.NoError(t, err)
	for _, name := range charts {
		t.Run(name, func(t *testing.T) {
			m := chartMetadata(t, name)
			assert.Equal(t, "Apache-2.0", m.Annotations["artifacthub.io/license"])
			assert.Contains(t, strings.Join(strings.Fields(string(license[:200])), " "), "Apache License Version 2.0")
			assert.Equal(t, repoURL, m.Home)
			assert.Contains(t, m.Sources, repoURL)
			assert.NotEmpty(t, m.Maintainers)
			require.True(t, strings.HasPrefix(m.Icon, rawURL+"main/"), "icon %s: a file of the repository", m.Icon)
			assert.FileExists(t, filepath.Join(root, strings.TrimPrefix(m.Icon, rawURL+"main/")))

			var images []struct{ Name, Image string }
			require.NoError(t, yaml.Unmarshal([]byte(m.Annotations["artifacthub.io/images"]), &images))
			var listed []string
			for _, im := range images {
				listed = append(listed, im.Image)
				assert.Equal(t, im.Name, strings.TrimPrefix(strings.Split(im.Image, ":")[0], "ghcr.io/elastic-training/"), "the name of %s", im.Image)
			}
			slices.Sort(listed)
			want := defaultImages(t, name)
			if name == "elastic-training" {
				// A job's pods run the sidecar that the webhook injects (the chart renders a placeholder for it).
				for _, im := range defaultImages(t, "elastic-training-webhook") {
					if strings.Contains(im, "/rdzv-sidecar:") && !slices.Contains(want, im) {
						want = append(want, im)
					}
				}
				slices.Sort(want)
			}
			assert.Equal(t, want, listed, "artifacthub.io/images (right) are the images the chart's pods run by default (left)")

			var links []struct{ Name, URL string }
			require.NoError(t, yaml.Unmarshal([]byte(m.Annotations["artifacthub.io/links"]), &links))
			require.NotEmpty(t, links)
			for _, l := range links {
				checkRepoLink(t, m.Version, l.URL, "artifacthub.io/links "+l.Name)
			}
		})
	}
}

// TestChartReadmeLinks: a chart's README is read where no repository is around it (`helm show readme`, Artifact
// Hub), so each link is absolute, into the repository at the chart's release tag, and leads to a file and heading
// that exist, or an anchor of the README itself.
func TestChartReadmeLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, name := range charts {
		t.Run(name, func(t *testing.T) {
			dir := chartrender.Dir(name)
			b, err := os.ReadFile(filepath.Join(dir, "README.md"))
			require.NoError(t, err)
			readme := string(b)
			version := chartMetadata(t, name).Version
			n := 0
			for _, m := range link.FindAllStringSubmatch(readme, -1) {
				n++
				switch target := m[1]; {
				case strings.HasPrefix(target, "#"):
					assert.Contains(t, headingAnchors(readme), strings.TrimPrefix(target, "#"), "%s: no heading for %s", name, target)
				case strings.HasPrefix(target, repoURL+"/"):
					checkRepoLink(t, version, target, name+"/README.md")
				case strings.HasPrefix(target, "https://"):
				default:
					t.Errorf("%s/README.md links %s: a relative link is dead in helm show readme and on Artifact Hub (link %s/blob/v%s/<path>)", name, target, repoURL, version)
				}
			}
			assert.NotZero(t, n, "no links found: the pattern is wrong")
		})
	}
}

// checkRepoLink: url is <repo>/blob/v<version>/<path>[#anchor] (or <repo>/tree/v<version>/<dir>) and path and
// anchor exist in this tree.
func checkRepoLink(t *testing.T, version, url, where string) {
	t.Helper()
	rest, ok := strings.CutPrefix(url, repoURL+"/")
	if !assert.True(t, ok, "%s: %s is not a link into %s", where, url, repoURL) {
		return
	}
	kind, rest, _ := strings.Cut(rest, "/")
	ref, rest, _ := strings.Cut(rest, "/")
	if !assert.Equal(t, "v"+version, ref, "%s: %s links another release than the chart's (v%s)", where, url, version) {
		return
	}
	path, anchor, _ := strings.Cut(rest, "#")
	full := filepath.Join(testenv.RepoRoot(), path)
	switch kind {
	case "tree":
		assert.DirExists(t, full, "%s: %s", where, url)
	case "blob":
		b, err := os.ReadFile(full)
		if !assert.NoError(t, err, "%s: %s", where, url) || anchor == "" {
			return
		}
		assert.Contains(t, headingAnchors(string(b)), anchor, "%s: %s has no heading for #%s", where, path, anchor)
	default:
		t.Errorf("%s: %s: want %s/blob/... or /tree/...", where, url, repoURL)
	}
}

// headingAnchors returns the anchors GitHub gives the Markdown headings of doc: lower case, punctuation but '-'
// and '_' dropped, each space a '-', and -1, -2... for repeats.
func headingAnchors(doc string) []string {
	var out []string
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && unicode.IsLetter(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}
