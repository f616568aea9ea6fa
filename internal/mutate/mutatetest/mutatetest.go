// Package mutatetest reads the pod files of internal/mutate/testdata for
// tests of the mutation and of the webhook that serves it.
package mutatetest

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// ReadPod reads a pod file; a field the pod type does not have fails the test.
func ReadPod(t testing.TB, file string) *corev1.Pod {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	pod := &corev1.Pod{}
	require.NoError(t, yaml.UnmarshalStrict(b, pod), file)
	return pod
}

// JSONForms returns a pod file's pod as JSON the two ways a request may
// carry it: printed from the typed pod (as the API server sends it), and as
// written (the YAML turned into JSON as it stands: no zero values, GPU counts
// as numbers).
func JSONForms(t testing.TB, file string) (typed, asWritten []byte) {
	t.Helper()
	typed, err := json.Marshal(ReadPod(t, file))
	require.NoError(t, err)
	y, err := os.ReadFile(file)
	require.NoError(t, err)
	asWritten, err = yaml.YAMLToJSON(y)
	require.NoError(t, err)
	return typed, asWritten
}
