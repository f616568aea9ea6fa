package mutate

import (
	"fmt"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
)

// editor changes the pod Mutate works on and writes down each change as a
// JSON patch operation where it is made, so that the patch and the pod cannot
// disagree. Every operation adds or removes at a path Mutate chose; nothing
// above it is rewritten, so fields this binary's k8s.io/api does not know (a
// newer API server's) are never touched, which a diff of the typed pod printed
// against the request's JSON could not promise. TestGolden and FuzzMutate
// check that the patch applied to the input's JSON gives Mutate's result.
type editor struct {
	pod      *corev1.Pod
	ops      []jsonpatch.Operation
	warnings []string
}

func (e *editor) warn(format string, args ...any) {
	e.warnings = append(e.warnings, fmt.Sprintf(format, args...))
}

// add is RFC 6902's add: it sets an object member whether it is there or
// not, and inserts into a list at an index or at its end ("-").
func (e *editor) add(path string, value any) {
	e.ops = append(e.ops, jsonpatch.NewOperation("add", path, value))
}

func (e *editor) remove(path string) {
	e.ops = append(e.ops, jsonpatch.NewOperation("remove", path, nil))
}

// set sets a field (which the caller knows to be unset, and so perhaps absent
// from the JSON) to value.
func set[T any](e *editor, path string, field *T, value T) {
	*field = value
	e.add(path, value)
}

// appendTo appends v to the list at path: the whole list where it is empty,
// and so perhaps absent from the JSON, at its end otherwise.
func appendTo[T any](e *editor, path string, list *[]T, v T) {
	if len(*list) == 0 {
		e.add(path, []T{v})
	} else {
		e.add(path+"/-", v)
	}
	*list = append(*list, v)
}

// setKey sets key k of the string map at path: the whole map where it is
// empty, and so perhaps absent from the JSON.
func setKey(e *editor, path string, m *map[string]string, k, v string) {
	if len(*m) == 0 {
		*m = map[string]string{k: v}
		e.add(path, map[string]string{k: v})
		return
	}
	(*m)[k] = v
	e.add(path+"/"+pointerToken(k), v)
}

func deleteKey(e *editor, path string, m map[string]string, k string) {
	delete(m, k)
	e.remove(path + "/" + pointerToken(k))
}

// pointerToken makes a map key one JSON pointer token (RFC 6901).
func pointerToken(key string) string { return pointerEscaper.Replace(key) }

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")
