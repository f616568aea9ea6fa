package jsonpatch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	gomodules "gomodules.xyz/jsonpatch/v2"
	evanphx "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

func TestCreate(t *testing.T) {
	for _, tc := range []struct {
		desc, a, b string
		want       string // the operations as JSON
	}{
		{desc: "equal", a: `{"a":1}`, b: `{"a":1}`, want: `[]`},
		{desc: "equal apart from whitespace", a: `{"a": [1, {"b": "c"}]}`, b: ` {"a":[1,{"b":"c"}]}`, want: `[]`},
		{desc: "key added, removed, changed", a: `{"keep":1,"gone":true,"change":"x"}`, b: `{"change":"y","keep":1,"new":{"n":null}}`,
			want: `[{"op":"replace","path":"/change","value":"y"},{"op":"add","path":"/new","value":{"n":null}},{"op":"remove","path":"/gone"}]`},
		{desc: "nested", a: `{"spec":{"containers":[{"name":"c","env":[{"name":"A","value":"1"}]}]}}`,
			b:    `{"spec":{"containers":[{"name":"c","env":[{"name":"A","value":"1"},{"name":"B","value":"2"}]}]}}`,
			want: `[{"op":"add","path":"/spec/containers/0/env/1","value":{"name":"B","value":"2"}}]`},
		{desc: "list grows", a: `[1,2]`, b: `[0,2,3,4]`,
			want: `[{"op":"add","path":"/2","value":3},{"op":"add","path":"/3","value":4},{"op":"replace","path":"/0","value":0}]`},
		{desc: "list shrinks from the end", a: `[1,2,3,4]`, b: `[1,5]`,
			want: `[{"op":"remove","path":"/3"},{"op":"remove","path":"/2"},{"op":"replace","path":"/1","value":5}]`},
		{desc: "an element inserted in front is one add", a: `[{"name":"a","x":1},{"name":"b"}]`, b: `[{"name":"new"},{"name":"a","x":1},{"name":"b"}]`,
			want: `[{"op":"add","path":"/0","value":{"name":"new"}}]`},
		{desc: "an element removed in front is one remove", a: `[1,2,3]`, b: `[2,3]`, want: `[{"op":"remove","path":"/0"}]`},
		{desc: "kept elements stay, the others are compared in place", a: `["f",{"old":1},"k",{"x":1}]`, b: `["new","f","k",{"x":2},"end"]`,
			want: `[{"op":"add","path":"/4","value":"end"},{"op":"replace","path":"/3/x","value":2},{"op":"remove","path":"/1"},{"op":"add","path":"/0","value":"new"}]`},
		{desc: "a changed element in place is compared recursively", a: `[{"name":"t","env":[1]}]`, b: `[{"name":"t","env":[1,2]}]`,
			want: `[{"op":"add","path":"/0/env/1","value":2}]`},
		{desc: "moved", a: `[1,2,3]`, b: `[3,1,2]`, want: `[{"op":"remove","path":"/2"},{"op":"add","path":"/0","value":3}]`},
		{desc: "type changes are replaced", a: `{"a":{"x":1},"b":[1],"c":null,"d":"1","e":true}`, b: `{"a":[1],"b":{"x":1},"c":0,"d":1,"e":null}`,
			want: `[{"op":"replace","path":"/a","value":[1]},{"op":"replace","path":"/b","value":{"x":1}},{"op":"replace","path":"/c","value":0},` +
				`{"op":"replace","path":"/d","value":1},{"op":"replace","path":"/e","value":null}]`},
		{desc: "booleans", a: `{"a":true,"b":false}`, b: `{"a":false,"b":false}`, want: `[{"op":"replace","path":"/a","value":false}]`},
		{desc: "numbers are compared by their text", a: `{"a":1,"b":2}`, b: `{"a":1.0,"b":2}`, want: `[{"op":"replace","path":"/a","value":1.0}]`},
		{desc: "strings are compared by their value", a: `{"a":"\u0041","b":"x"}`, b: `{"a":"A","b":"y"}`, want: `[{"op":"replace","path":"/b","value":"y"}]`},
		{desc: "keys are unescaped and written as JSON pointers", a: `{"x":{}}`, b: `{"x":{"elastic-training.io/job":"j","a~b":1,"\u00e9\"":2}}`,
			want: `[{"op":"add","path":"/x/elastic-training.io~1job","value":"j"},{"op":"add","path":"/x/a~0b","value":1},{"op":"add","path":"/x/é\"","value":2}]`},
		{desc: "the last of duplicate keys wins", a: `{"a":1,"a":2,"b":3,"b":4}`, b: `{"a":2,"c":5,"c":6}`,
			want: `[{"op":"add","path":"/c","value":6},{"op":"remove","path":"/b"}]`},
		{desc: "root replaced", a: `{"a":1}`, b: `[1]`, want: `[{"op":"replace","path":"","value":[1]}]`},
		{desc: "empty containers", a: `{"a":{},"b":[]}`, b: `{"a":{"x":[]},"b":[{}]}`,
			want: `[{"op":"add","path":"/a/x","value":[]},{"op":"add","path":"/b/0","value":{}}]`},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			ops, err := Create([]byte(tc.a), []byte(tc.b))
			require.NoError(t, err)
			got, err := Marshal(ops)
			require.NoError(t, err)
			if diff := cmp.Diff(tc.want, string(got)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			std, err := json.Marshal(ops)
			require.NoError(t, err)
			require.Equal(t, string(std), string(got), "Marshal differs from json.Marshal")
		})
	}
}

// TestCreateLargeObject: objects too large for the key table on the stack.
func TestCreateLargeObject(t *testing.T) {
	a, b := map[string]int{}, map[string]int{}
	for i := range 100 {
		a[fmt.Sprintf("k%03d", i)] = i
		b[fmt.Sprintf("k%03d", i)] = i
	}
	b["k007"] = -7
	delete(b, "k050")
	b["new"] = 1
	ja, err := json.Marshal(a)
	require.NoError(t, err)
	jb, err := json.Marshal(b)
	require.NoError(t, err)
	ja = append(ja[:len(ja)-1], `,"k010":-10}`...) // a later duplicate wins
	ops, err := Create(ja, jb)
	require.NoError(t, err)
	got, err := Marshal(ops)
	require.NoError(t, err)
	require.Equal(t, `[{"op":"replace","path":"/k007","value":-7},{"op":"replace","path":"/k010","value":10},`+
		`{"op":"add","path":"/new","value":1},{"op":"remove","path":"/k050"}]`, string(got))
	checkPatch(t, ja, jb)
}

// TestMarshal: the same text as json.Marshal with gomodules' Operation.MarshalJSON.
func TestMarshal(t *testing.T) {
	for _, tc := range []struct {
		desc string
		ops  []Operation
	}{
		{desc: "none", ops: []Operation{}},
		{desc: "values of every kind", ops: []Operation{
			gomodules.NewOperation("add", "/a", json.RawMessage(`{"b":[1,"\u003c\u0026\u003e"]}`)),
			gomodules.NewOperation("add", "/b", nil),
			gomodules.NewOperation("replace", "/c", nil),
			gomodules.NewOperation("replace", "/d", map[string]any{"z": 1, "a": "x"}),
			gomodules.NewOperation("remove", "/e", nil),
			gomodules.NewOperation("remove", "/f", "unusual but kept"),
			gomodules.NewOperation("test", "/g", nil),
			gomodules.NewOperation("add", "/h", json.RawMessage(nil)),
		}},
		{desc: "paths that need escaping", ops: []Operation{
			gomodules.NewOperation("add", "/a\"b\\c", json.RawMessage(`1`)),
			gomodules.NewOperation("add", "/<é>\u2028\x01", json.RawMessage(`2`)),
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := Marshal(tc.ops)
			require.NoError(t, err)
			want, err := json.Marshal(tc.ops)
			require.NoError(t, err)
			require.Equal(t, string(want), string(got))
		})
	}
	// Raw values are copied as they are; json.Marshal would also escape <, > and & for HTML.
	got, err := Marshal([]Operation{gomodules.NewOperation("add", "/a", json.RawMessage(`"<&>"`))})
	require.NoError(t, err)
	require.Equal(t, `[{"op":"add","path":"/a","value":"<&>"}]`, string(got))
	_, err = Marshal([]Operation{gomodules.NewOperation("add", "/a", func() {})})
	require.ErrorContains(t, err, `json patch: value at "/a"`)
}

func TestCreateRefusesBrokenStructure(t *testing.T) {
	for _, tc := range []struct{ desc, a, b string }{
		{desc: "empty", a: ``, b: `{}`},
		{desc: "unterminated object", a: `{"a":1}`, b: `{"a":2`},
		{desc: "missing colon", a: `{"a":1}`, b: `{"a" 2}`},
		{desc: "unterminated string", a: `{"a":"x"}`, b: `{"a":"y}`},
		{desc: "missing value", a: `[1]`, b: `[1,]`},
		{desc: "trailing data", a: `{"a":[1]}`, b: `{"a":[2]x}`},
		{desc: "unterminated nested list", a: `{"a":[1]}`, b: `{"a":[[2]}`},
		{desc: "mismatched brackets", a: `{"a":[1}}`, b: `{"a":[2]}`},
		{desc: "closing bracket without opening", a: `{"a":1}}`, b: `{"a":2}`},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := Create([]byte(tc.a), []byte(tc.b))
			require.Error(t, err)
		})
	}
}

// TestGoldenPods diffs each golden pod of internal/mutate against its input,
// both printed by json.Marshal as the webhook does: applied to the input the
// patch gives the golden pod, and it has no more operations than gomodules'.
func TestGoldenPods(t *testing.T) {
	inputs, err := filepath.Glob("../mutate/testdata/*.golden.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, inputs)
	for _, golden := range inputs {
		name := strings.TrimSuffix(filepath.Base(golden), ".golden.yaml")
		t.Run(name, func(t *testing.T) {
			a, b := goldenJSON(t, golden)
			ops := checkPatch(t, a, b)
			want, err := gomodules.CreatePatch(a, b)
			require.NoError(t, err)
			require.LessOrEqual(t, len(ops), len(want))
		})
	}
}

// TestCreateConcurrent: diffs running at the same time share no state (Create
// reuses the stacks of finished diffs), and a diff that needed large stacks
// leaves none behind that change the next one's result.
func TestCreateConcurrent(t *testing.T) {
	type tc struct{ a, b []byte }
	var cases []tc
	var large strings.Builder
	large.WriteString(`{"x":[`)
	for i := range 20000 {
		if i > 0 {
			large.WriteByte(',')
		}
		fmt.Fprintf(&large, `{"k%d":[%d]}`, i, i)
	}
	large.WriteString(`]}`)
	cases = append(cases, tc{[]byte(large.String()), []byte(`{"x":[{"k0":[1]}],"y":{"a/b~c":"d"}}`)})
	goldens, err := filepath.Glob("../mutate/testdata/*.golden.yaml")
	require.NoError(t, err)
	for _, golden := range goldens {
		a, b := goldenJSON(t, golden)
		cases = append(cases, tc{a, b})
	}
	want := make([]string, len(cases))
	for i, c := range cases {
		ops, err := Create(c.a, c.b)
		require.NoError(t, err)
		raw, err := Marshal(ops)
		require.NoError(t, err)
		want[i] = string(raw)
	}
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for n := range 20 {
				i := (g + n) % len(cases)
				ops, err := Create(cases[i].a, cases[i].b)
				if err == nil {
					var raw []byte
					if raw, err = Marshal(ops); err == nil && string(raw) != want[i] {
						err = fmt.Errorf("case %d: got %s, want %s", i, raw, want[i])
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
}

// FuzzCreate applies Create's patch for arbitrary pairs of JSON documents;
// for documents without lists the operations must be gomodules'.
func FuzzCreate(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[1,2,{"c":"d"}]}`), []byte(`{"a":2,"b":[1,{"c":"e"}],"f":null}`))
	f.Add([]byte(`[1,"x",true,null,{}]`), []byte(`[1,"y",false,{},{"a/b~":[]}]`))
	f.Add([]byte(`{"a":{"b":{"c":[1,2,3]}}}`), []byte(`{"a":{"b":{"c":[3,2,1,0]},"d":"\u00e9"}}`))
	f.Add([]byte(`{"a":{"b":1,"c":{"d":"x"}},"e":true}`), []byte(`{"a":{"b":"1","c":{"d":"y","f":{}}},"g":null}`))
	f.Add([]byte(`{"a":1e2}`), []byte(`{"a":100}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if !json.Valid(a) || !json.Valid(b) {
			return
		}
		ops := checkPatch(t, a, b)
		if bytes.ContainsAny(a, "[]") || bytes.ContainsAny(b, "[]") {
			return
		}
		if want, err := gomodules.CreatePatch(a, b); err == nil {
			sameOperations(t, want, ops)
		}
	})
}

// checkPatch creates the patch from a to b, checks that Marshal encodes it as
// json.Marshal does, and that it turns a into b.
func checkPatch(t *testing.T, a, b []byte) []Operation {
	t.Helper()
	ops, err := Create(a, b)
	require.NoError(t, err)
	raw, err := Marshal(ops)
	require.NoError(t, err)
	std, err := json.Marshal(ops)
	require.NoError(t, err)
	require.True(t, json.Valid(raw), "Marshal: %s", raw)
	require.True(t, sameJSON(t, std, raw), "Marshal %s, json.Marshal %s", raw, std)
	if !isContainer(a) || !isContainer(b) {
		// The library patches objects and lists only: the patch must replace the whole document.
		if sameJSON(t, a, b) {
			require.Empty(t, ops)
		} else {
			require.Len(t, ops, 1)
			require.Equal(t, "replace", ops[0].Operation)
			require.Equal(t, "", ops[0].Path)
			require.True(t, sameJSON(t, b, ops[0].Value.(json.RawMessage)))
		}
		return ops
	}
	p, err := evanphx.DecodePatch(raw)
	require.NoError(t, err)
	patched, err := p.Apply(a)
	require.NoError(t, err, "patch %s", raw)
	require.True(t, sameJSON(t, b, patched), "patch %s\ngave %s\nwant %s", raw, patched, b)
	return ops
}

// sameOperations: Create's operations are gomodules' apart from their order and
// from numbers that are equal as float64 but written differently (which
// gomodules v2.4 leaves alone and Create replaces).
func sameOperations(t *testing.T, want, got []Operation) {
	t.Helper()
	// Compare through JSON so that RawMessage and map values meet as the same types.
	norm := func(ops []Operation) []map[string]any {
		raw, err := json.Marshal(ops)
		require.NoError(t, err)
		var out []map[string]any
		require.NoError(t, json.Unmarshal(raw, &out))
		sort.Slice(out, func(i, j int) bool {
			return out[i]["path"].(string)+" "+out[i]["op"].(string) < out[j]["path"].(string)+" "+out[j]["op"].(string)
		})
		return out
	}
	gotN, wantN := norm(got), norm(want)
	inWant := map[string]bool{}
	for _, op := range wantN {
		inWant[op["path"].(string)] = true
	}
	kept := gotN[:0]
	for _, op := range gotN {
		if _, isNumber := op["value"].(float64); op["op"] == "replace" && isNumber && !inWant[op["path"].(string)] {
			continue
		}
		kept = append(kept, op)
	}
	if diff := cmp.Diff(wantN, kept); diff != "" {
		t.Fatalf("operations differ from gomodules' (-gomodules +Create):\n%s", diff)
	}
}

func isContainer(doc []byte) bool {
	doc = bytes.TrimSpace(doc)
	return doc[0] == '{' || doc[0] == '['
}

// sameJSON compares two documents as values, numbers by their text.
func sameJSON(t *testing.T, x, y []byte) bool {
	t.Helper()
	decode := func(b []byte) any {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		var v any
		require.NoError(t, d.Decode(&v))
		return v
	}
	return cmp.Equal(decode(x), decode(y))
}

// BenchmarkCreate diffs the webhook benchmark's pod before and after mutation.
func BenchmarkCreate(b *testing.B) {
	read := func(file string, into any) []byte {
		raw, err := os.ReadFile(file)
		require.NoError(b, err)
		require.NoError(b, yaml.Unmarshal(raw, into))
		return raw
	}
	in := &corev1.Pod{}
	read("../mutate/testdata/pytorch-worker0-serves-rdzv.yaml", in)
	out := struct {
		Pod *corev1.Pod `json:"pod"`
	}{}
	read("../mutate/testdata/pytorch-worker0-serves-rdzv.golden.yaml", &out)
	a, err := json.Marshal(in)
	require.NoError(b, err)
	c, err := json.Marshal(out.Pod)
	require.NoError(b, err)
	jsonMarshal := func(ops []Operation) ([]byte, error) { return json.Marshal(ops) }
	for _, impl := range []struct {
		name    string
		create  func(a, b []byte) ([]Operation, error)
		marshal func([]Operation) ([]byte, error)
	}{
		{"Create+Marshal", Create, Marshal},
		{"gomodules+json.Marshal", gomodules.CreatePatch, jsonMarshal}, // what PatchResponseFromRaw and Response.Complete do
	} {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ops, err := impl.create(a, c)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := impl.marshal(ops); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// goldenJSON returns the JSON of a mutate golden case's input pod and of its
// expected output pod.
func goldenJSON(t *testing.T, golden string) (in, out []byte) {
	t.Helper()
	pod := &corev1.Pod{}
	b, err := os.ReadFile(strings.TrimSuffix(golden, ".golden.yaml") + ".yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, pod))
	want := struct {
		Pod *corev1.Pod `json:"pod"`
	}{}
	b, err = os.ReadFile(golden)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &want))
	in, err = json.Marshal(pod)
	require.NoError(t, err)
	out, err = json.Marshal(want.Pod)
	require.NoError(t, err)
	return in, out
}
