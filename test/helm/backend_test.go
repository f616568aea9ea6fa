package helm_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// rendezvous.backend auto (the default) is the elastic-training backend, unless the trainer image's tag names a torch
// older than 2.5 the way pytorch/pytorch's tags do: torchrun finds the own backend only through torch >= 2.5's
// entry point. A backend the user names is kept as it is.
func TestBackendAuto(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for name, c := range map[string]struct {
		tag, backend, want string
	}{
		"the default image (torch 2.5.1)":       {"", "", constants.BackendElasticTraining},
		"pytorch/pytorch's tag of torch 2.4":    {"2.4.1-cuda12.1-cudnn9-runtime", "", constants.BackendC10d},
		"torch 1.13":                            {"1.13.1-cuda11.6-cudnn8-runtime", "auto", constants.BackendC10d},
		"torch 2.10: minor 10 is not below 5":   {"2.10.0-cuda12.8-cudnn9-runtime", "", constants.BackendElasticTraining},
		"a tag that names no torch (NGC 24.10)": {"24.10-py3", "", constants.BackendElasticTraining},
		"named by the user":                     {"2.4.1-cuda12.1-cudnn9-runtime", constants.BackendElasticTraining, constants.BackendElasticTraining},
		"c10d named by the user":                {"", constants.BackendC10d, constants.BackendC10d},
	} {
		t.Run(name, func(t *testing.T) {
			v := merge(pinned(t), map[string]any{"command": []any{"torchrun", "train.py"}})
			if c.tag != "" {
				v = merge(v, map[string]any{"image": map[string]any{"tag": c.tag}})
			}
			if c.backend != "" {
				v = merge(v, map[string]any{"rendezvous": map[string]any{"backend": c.backend}})
			}
			r, err := render(ch, v, chartrender.Options{})
			require.NoError(t, err)
			specs := podSpecs(t, r)
			require.NotEmpty(t, specs)
			for key, s := range specs {
				assert.Equal(t, c.want, s.Annotations[constants.AnnotationRdzvBackend], key)
			}
		})
	}
}
