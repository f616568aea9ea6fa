package helm_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// schemaEnum is a valid-value list of internal/constants that a chart's schema repeats as an enum.
type schemaEnum struct {
	constant string // its name in internal/constants, for messages
	values   []string
}

// schemaEnums maps a schema property name to the list its enum must hold, wherever the property appears.
var schemaEnums = map[string]schemaEnum{
	"framework":   {"Frameworks", constants.Frameworks},   // job chart: framework
	"backend":     {"Backends", constants.Backends},       // job chart: rendezvous.backend
	"rdzvBackend": {"Backends", constants.Backends},       // webhook chart: defaults.rdzvBackend
	"flavour":     {"MPIFlavours", constants.MPIFlavours}, // job chart: mpi.flavour
	"mpiFlavour":  {"MPIFlavours", constants.MPIFlavours}, // webhook chart: defaults.mpiFlavour
	"pullPolicy":  {"PullPolicies", constants.PullPolicies},
}

// TestSchemaEnumsMatchConstants checks that every enum of both charts' values.schema.json for a framework,
// rendezvous backend, MPI flavour or image pull policy holds exactly the values internal/constants lists (in any
// order: a schema may list the default first), and that each chart has the properties it is expected to have.
func TestSchemaEnumsMatchConstants(t *testing.T) {
	for _, c := range []struct {
		chart string
		// want are the property names the schema must have (at least once).
		want []string
		// extra are values a property's enum has besides the constants' list, and why.
		extra map[string][]string
	}{
		// "auto": the chart resolves it (elastic-training.backend) before any pod names a backend.
		{"elastic-training", []string{"framework", "backend", "flavour", "pullPolicy"}, map[string][]string{"backend": {"auto"}}},
		// "": the webhook passes no --sidecar-image-pull-policy, and injected sidecars get Kubernetes' default
		// (mutate.Config.SidecarImagePullPolicy); the webhook's own image likewise.
		{"elastic-training-webhook", []string{"rdzvBackend", "mpiFlavour", "pullPolicy"}, map[string][]string{"pullPolicy": {""}}},
	} {
		t.Run(c.chart, func(t *testing.T) {
			file := filepath.Join(chartrender.Dir(c.chart), "values.schema.json")
			raw, err := os.ReadFile(file)
			require.NoError(t, err)
			var root map[string]any
			require.NoError(t, json.Unmarshal(raw, &root), file)
			found := map[string]int{}
			walkProperties(root, "", func(path, name string, prop map[string]any) {
				e, ok := schemaEnums[name]
				if !ok {
					return
				}
				found[name]++
				prop = resolveRef(t, root, prop)
				list, ok := prop["enum"].([]any)
				if !ok {
					t.Errorf("%s %s: no enum; want internal/constants.%s %q", file, path, e.constant, e.values)
					return
				}
				var got []string
				for _, v := range list {
					s, ok := v.(string)
					if !ok {
						t.Errorf("%s %s: enum value %v is not a string", file, path, v)
						continue
					}
					got = append(got, s)
				}
				want := append(slices.Clone(e.values), c.extra[name]...)
				slices.Sort(want)
				slices.Sort(got)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s %s: enum differs from internal/constants.%s%s (-want +got):\n%s",
						file, path, e.constant, extraNote(c.extra[name]), diff)
				}
			})
			t.Logf("%s: enums checked per property name: %v", file, found)
			for _, name := range c.want {
				if found[name] == 0 {
					t.Errorf("%s: no property %q found; this test expects one (update the test if it was renamed)", file, name)
				}
			}
		})
	}
}

func extraNote(extra []string) string {
	if len(extra) == 0 {
		return ""
	}
	return fmt.Sprintf(" plus %q", extra)
}

// walkProperties calls fn for every named property of every (sub)schema under node, definitions included;
// path is the property's JSON pointer in the schema file.
func walkProperties(node any, path string, fn func(path, name string, prop map[string]any)) {
	switch n := node.(type) {
	case map[string]any:
		if props, ok := n["properties"].(map[string]any); ok {
			for name, p := range props {
				if pm, ok := p.(map[string]any); ok {
					fn(path+"/properties/"+name, name, pm)
				}
			}
		}
		for k, v := range n {
			walkProperties(v, path+"/"+k, fn)
		}
	case []any:
		for i, v := range n {
			walkProperties(v, path+"/"+strconv.Itoa(i), fn)
		}
	}
}

// resolveRef follows a property's local $ref ("#/definitions/x"), if it has one.
func resolveRef(t *testing.T, root, prop map[string]any) map[string]any {
	t.Helper()
	for range 10 {
		ref, ok := prop["$ref"].(string)
		if !ok {
			return prop
		}
		var node any = root
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			m, _ := node.(map[string]any)
			node = m[part]
		}
		next, ok := node.(map[string]any)
		if !ok {
			t.Errorf("$ref %q does not resolve", ref)
			return prop
		}
		prop = next
	}
	return prop
}
