package mutate

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// The denial keeps the webhook's wording whatever field.Error's own would be.
func TestDenialWording(t *testing.T) {
	cases := []struct {
		desc string
		errs field.ErrorList
		want string
	}{
		{"none", nil, ""},
		{"invalid annotation", field.ErrorList{field.Invalid(annotationPath("example.io/a"), `x"y`, "a number")},
			`annotation example.io/a="x\"y" is invalid: want a number`},
		{"missing label", field.ErrorList{field.Required(labelPath("example.io/l"), "a DNS label")},
			`label example.io/l is missing: want a DNS label`},
		{"a key holding brackets and dots comes back whole", field.ErrorList{field.Invalid(annotationPath("a.b/c]d[e"), "v", "w")},
			`annotation a.b/c]d[e="v" is invalid: want w`},
		{"a conflict is its whole sentence", field.ErrorList{field.Forbidden(annotationPath("example.io/a"), "a and b together")},
			"a and b together"},
		{"a problem outside labels and annotations is its whole sentence", field.ErrorList{field.Required(containersPath, "pod has no containers")},
			"pod has no containers"},
		{"the whole metadata is no key", field.ErrorList{field.Invalid(annotationsPath, "v", "w")}, "w"},
		{"several, in order", field.ErrorList{
			field.Invalid(annotationPath("k1"), "1", "w1"),
			field.Required(annotationPath("k2"), "w2"),
			field.Forbidden(containersPath.Index(0).Child("name"), "s3"),
		}, `annotation k1="1" is invalid: want w1; annotation k2 is missing: want w2; s3`},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			err := denial(tc.errs)
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, tc.want)
		})
	}
}

// The trainer starts with its sidecar only where its agent waits for the store and for its pod's registration
// itself: the elastic-training backend. torch's c10d and etcd backends give up on a store that does not answer
// within their timeout, and the other frameworks read the job's files as they start.
func TestStartPath(t *testing.T) {
	for _, c := range []struct {
		framework, backend, want string
	}{
		{constants.FrameworkPyTorch, constants.BackendElasticTraining, "/startz"},
		{constants.FrameworkPyTorch, constants.BackendC10d, "/readyz"},
		{constants.FrameworkPyTorch, constants.BackendEtcdV2, "/readyz"},
		{constants.FrameworkPyTorch, constants.BackendEtcd, "/readyz"},
		{constants.FrameworkMPI, "", "/readyz"},
		{constants.FrameworkMXNet, "", "/readyz"},
		{constants.FrameworkCustom, "", "/readyz"},
	} {
		s := &settings{framework: c.framework, backend: c.backend}
		assert.Equal(t, c.want, s.startPath(), "%s on %q", c.framework, c.backend)
	}
}
