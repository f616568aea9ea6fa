// Package jsonpatch creates the JSON patch (RFC 6902) between two JSON
// documents, as gomodules.xyz/jsonpatch/v2 does (the library behind
// controller-runtime's admission.PatchResponseFromRaw), at a fraction of its
// cost, and with lists diffed so that an element inserted in front does not
// rewrite the elements after it.
//
// gomodules' CreatePatch decodes both documents into map[string]any trees and
// diffs those; the values of its operations are such trees again, which
// encoding/json then sorts and prints key by key. For a pod that is most of a
// webhook's time. Create walks the two texts side by side instead: a subtree
// whose bytes are equal in both is skipped without being parsed, and a new
// value goes into its operation as the bytes it has in the new document
// (json.RawMessage).
package jsonpatch

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
	"unsafe"

	gomodules "gomodules.xyz/jsonpatch/v2"
)

// Operation is one patch operation; the type is gomodules', so a result fits
// controller-runtime's admission.Response.Patches.
type Operation = gomodules.Operation

// Create returns the operations that turn the JSON document a into b:
//   - objects are compared key by key, as gomodules does: a key only in b is
//     added, a key only in a removed, a key in both compared recursively;
//   - a value whose JSON type changed, or a string or boolean that differs, is
//     replaced, as gomodules does. Numbers are compared by their text, as
//     gomodules v2.5 does (v2.4 compares float64 values: 1 and 1.0 are equal);
//   - lists keep their elements that are equal in both (a longest common
//     subsequence, by bytes) where they are; the elements between two kept
//     ones are compared position by position, as gomodules compares whole
//     lists: pairs recursively, the surplus removed or added. So inserting
//     an element in front of others is one "add". gomodules pairs every
//     element with the one that took its index, which rewrites them all and,
//     when the patch is applied to a document with fields a and b do not
//     carry (a newer API server's, for a webhook that diffs typed objects),
//     leaves those fields on the element that took the index. (Lists whose
//     differing middles are too long for the table, maxCommonCells, are
//     compared position by position.)
//
// The order of the operations is stable (gomodules' follows map iteration):
// b's keys in document order, then a's removed keys; lists from their end.
// The Value of an added or replaced value is a json.RawMessage of b's bytes.
//
// a and b must be valid JSON, such as json.Marshal returns. Create checks the
// structure of what it walks into, but not the text of values it skips as
// equal or copies into operations (Marshal copies them as they are;
// json.Marshal checks them).
func Create(a, b []byte) ([]Operation, error) {
	a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
	if len(a) == 0 || len(b) == 0 {
		return nil, errors.New("json patch: empty document")
	}
	d := differs.Get().(*differ)
	defer d.free()
	if err := d.a.index(a); err != nil {
		return nil, fmt.Errorf("json patch: first document: %w", err)
	}
	if err := d.b.index(b); err != nil {
		return nil, fmt.Errorf("json patch: second document: %w", err)
	}
	if err := d.diff(a, b); err != nil {
		return nil, err
	}
	return d.operations(), nil
}

// differ walks a value of text a and a value of text b side by side. Its
// slices are stacks shared by the levels of the walk (a level appends its
// members or elements and cuts them off again when it returns), so that a
// diff allocates per document, not per object or list it walks into.
type differ struct {
	a, b text
	// path is the JSON pointer of the values being compared.
	path    []byte
	members []member
	elems   [][]byte
	kept    []pair
	// ops are the operations found so far; their paths are written one after
	// another into paths, which becomes a single string at the end.
	ops   []pendingOp
	paths []byte
}

// differs keeps the stacks of finished diffs for the next ones: a webhook
// diffs one pod after another, and they need stacks of about the same size.
var differs = sync.Pool{New: func() any {
	// Large enough for a pod.
	return &differ{
		a:       text{spans: make([]span, 0, 256)},
		b:       text{spans: make([]span, 0, 256)},
		path:    make([]byte, 0, 256),
		members: make([]member, 0, 64),
		elems:   make([][]byte, 0, 32),
		kept:    make([]pair, 0, 32),
		ops:     make([]pendingOp, 0, 32),
		paths:   make([]byte, 0, 1024),
	}
}}

// maxPooled is the most bytes a differ's stack may hold to be kept for the
// next diff: the stacks of one very large document should not be held on to.
const maxPooled = 64 << 10

// free forgets the documents and gives d back to differs.
func (d *differ) free() {
	if tooLarge(d.a.spans) || tooLarge(d.b.spans) || tooLarge(d.path) || tooLarge(d.members) ||
		tooLarge(d.elems) || tooLarge(d.kept) || tooLarge(d.ops) || tooLarge(d.paths) {
		return
	}
	clear(d.members[:cap(d.members)])
	clear(d.elems[:cap(d.elems)])
	clear(d.ops[:cap(d.ops)])
	*d = differ{
		a: text{spans: d.a.spans[:0]}, b: text{spans: d.b.spans[:0]},
		path: d.path[:0], members: d.members[:0], elems: d.elems[:0], kept: d.kept[:0],
		ops: d.ops[:0], paths: d.paths[:0],
	}
	differs.Put(d)
}

func tooLarge[T any](s []T) bool {
	var v T
	return uintptr(cap(s))*unsafe.Sizeof(v) > maxPooled
}

// pendingOp is an Operation whose path is paths[pathStart:pathEnd] of its
// differ; value is nil for a remove.
type pendingOp struct {
	op                 string
	pathStart, pathEnd int
	value              []byte
}

// emit records operation op with value at the current path.
func (d *differ) emit(op string, value []byte) {
	start := len(d.paths)
	d.paths = append(d.paths, d.path...)
	d.ops = append(d.ops, pendingOp{op: op, pathStart: start, pathEnd: len(d.paths), value: value})
}

// operations returns the recorded operations. The Value of an add or replace
// is a json.RawMessage, of a remove nil, as gomodules.NewOperation sets them.
func (d *differ) operations() []Operation {
	paths := string(d.paths)
	ops := make([]Operation, len(d.ops))
	for i, o := range d.ops {
		ops[i] = Operation{Operation: o.op, Path: paths[o.pathStart:o.pathEnd]}
		if o.value != nil {
			ops[i].Value = json.RawMessage(o.value)
		}
	}
	return ops
}

// diff records the operations that turn value a into value b at d.path.
func (d *differ) diff(a, b []byte) error {
	if bytes.Equal(a, b) {
		return nil
	}
	ka, kb := kindOf(a[0]), kindOf(b[0])
	if ka != kb {
		d.emit("replace", b)
		return nil
	}
	switch ka {
	case kindObject:
		return d.diffObjects(a, b)
	case kindArray:
		return d.diffArrays(a, b)
	case kindString:
		equal, err := equalStrings(a, b)
		if err != nil {
			return d.pathError(err)
		}
		if equal {
			return nil
		}
	}
	// Different strings, numbers or booleans (equal ones had equal bytes,
	// and null has only one spelling).
	d.emit("replace", b)
	return nil
}

// equalStrings compares two quoted strings whose bytes differ by their
// values. Without escapes and with valid UTF-8 (which decoding would replace
// by U+FFFD) different bytes are different values.
func equalStrings(a, b []byte) (bool, error) {
	if plainString(a) && plainString(b) {
		return false, nil
	}
	var sa, sb string
	if err := json.Unmarshal(a, &sa); err != nil {
		return false, err
	}
	if err := json.Unmarshal(b, &sb); err != nil {
		return false, err
	}
	return sa == sb, nil
}

func plainString(quoted []byte) bool {
	raw := quoted[1 : len(quoted)-1]
	return bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw)
}

func (d *differ) diffObjects(a, b []byte) error {
	base := len(d.members)
	var err error
	if d.members, err = d.a.appendMembers(d.members, a); err != nil {
		return d.pathError(err)
	}
	mid := len(d.members)
	if d.members, err = d.b.appendMembers(d.members, b); err != nil {
		return d.pathError(err)
	}
	// Deeper levels append to d.members past these (and may move it to a
	// larger array): ma and mb stay valid.
	ma, mb := d.members[base:mid:mid], d.members[mid:len(d.members):len(d.members)]
	// Of duplicate keys the last wins, as in encoding/json.
	var slotsA, slotsB [64]int32
	ia, ib := newKeyIndex(ma, slotsA[:]), newKeyIndex(mb, slotsB[:])
	n := len(d.path)
	for i, m := range mb {
		if ib.last(m) != i {
			continue
		}
		j := ia.last(m)
		if j < 0 {
			d.path = appendKey(d.path, m.key)
			d.emit("add", m.value)
			d.path = d.path[:n]
			continue
		}
		if bytes.Equal(ma[j].value, m.value) {
			continue // the common case: skip it before building its path
		}
		d.path = appendKey(d.path, m.key)
		if err := d.diff(ma[j].value, m.value); err != nil {
			return err
		}
		d.path = d.path[:n]
	}
	for j, m := range ma {
		if ia.last(m) == j && ib.last(m) < 0 {
			d.path = appendKey(d.path, m.key)
			d.emit("remove", nil)
			d.path = d.path[:n]
		}
	}
	d.members = d.members[:base]
	return nil
}

// keyIndex finds the last member of an object with a given key: a small
// open-addressing table, on the caller's stack for objects of up to 32
// members (a map would allocate every key).
type keyIndex struct {
	ms    []member
	slots []int32 // 1 + index into ms; 0 for an empty slot
}

func newKeyIndex(ms []member, buf []int32) keyIndex {
	size := 8
	for size < 2*len(ms) {
		size *= 2
	}
	if size > len(buf) {
		buf = make([]int32, size)
	}
	x := keyIndex{ms: ms, slots: buf[:size]}
	for i, m := range ms {
		h := x.find(m)
		x.slots[h] = int32(i + 1) // a later duplicate replaces an earlier one
	}
	return x
}

// find returns the slot of m's key, or the empty slot where it would go.
func (x keyIndex) find(m member) int {
	mask := uint32(len(x.slots) - 1)
	for h := m.hash & mask; ; h = (h + 1) & mask {
		if s := x.slots[h]; s == 0 || x.ms[s-1].hash == m.hash && bytes.Equal(x.ms[s-1].key, m.key) {
			return int(h)
		}
	}
}

// last returns the index of the last member with m's key, or -1.
func (x keyIndex) last(m member) int {
	return int(x.slots[x.find(m)]) - 1
}

// hashKey is FNV-1a.
func hashKey(key []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range key {
		h = (h ^ uint32(c)) * 16777619
	}
	return h
}

// diffArrays keeps the elements that are equal in both lists where they
// are, and compares the ones between two kept elements position by position:
// the pairs recursively, then the surplus removed or added.
func (d *differ) diffArrays(a, b []byte) error {
	base := len(d.elems)
	var err error
	if d.elems, err = d.a.appendElements(d.elems, a); err != nil {
		return d.pathError(err)
	}
	mid := len(d.elems)
	if d.elems, err = d.b.appendElements(d.elems, b); err != nil {
		return d.pathError(err)
	}
	ea, eb := d.elems[base:mid:mid], d.elems[mid:len(d.elems):len(d.elems)]
	keptBase := len(d.kept)
	d.kept = appendCommonElements(d.kept, ea, eb)
	kept := d.kept[keptBase:len(d.kept):len(d.kept)]
	// From the last gap to the first: operations at one index do not move
	// the elements before it, so every gap starts at its index in a.
	endA, endB := len(ea), len(eb)
	for k := len(kept); k >= 0; k-- {
		startA, startB := 0, 0
		if k > 0 {
			startA, startB = kept[k-1].a+1, kept[k-1].b+1
		}
		if err := d.diffGap(ea[startA:endA], eb[startB:endB], startA); err != nil {
			return err
		}
		if k > 0 {
			endA, endB = kept[k-1].a, kept[k-1].b
		}
	}
	d.elems, d.kept = d.elems[:base], d.kept[:keptBase]
	return nil
}

// diffGap compares the elements ga, at index at of the list at d.path, with
// gb position by position, as gomodules compares whole lists.
func (d *differ) diffGap(ga, gb [][]byte, at int) error {
	n, p := min(len(ga), len(gb)), len(d.path)
	for i := len(ga) - 1; i >= n; i-- {
		d.path = appendIndex(d.path, at+i)
		d.emit("remove", nil)
		d.path = d.path[:p]
	}
	for i := n; i < len(gb); i++ {
		d.path = appendIndex(d.path, at+i)
		d.emit("add", gb[i])
		d.path = d.path[:p]
	}
	for i := range n {
		if bytes.Equal(ga[i], gb[i]) {
			continue
		}
		d.path = appendIndex(d.path, at+i)
		if err := d.diff(ga[i], gb[i]); err != nil {
			return err
		}
		d.path = d.path[:p]
	}
	return nil
}

// pair is an element at index a of one list and b of the other.
type pair struct{ a, b int }

// maxCommonCells bounds the table of appendCommonElements (int32 cells):
// lists whose differing middles are larger are compared position by position.
const maxCommonCells = 1 << 14

// appendCommonElements appends to kept a longest run of elements (by their
// bytes) that both lists have in the same order: the common beginning and
// end, and between them a longest common subsequence.
func appendCommonElements(kept []pair, ea, eb [][]byte) []pair {
	pre := 0
	for pre < len(ea) && pre < len(eb) && bytes.Equal(ea[pre], eb[pre]) {
		kept = append(kept, pair{pre, pre})
		pre++
	}
	suf := 0
	for suf < len(ea)-pre && suf < len(eb)-pre && bytes.Equal(ea[len(ea)-1-suf], eb[len(eb)-1-suf]) {
		suf++
	}
	ma, mb := ea[pre:len(ea)-suf], eb[pre:len(eb)-suf]
	if len(ma) > 0 && len(mb) > 0 && (len(ma)+1)*(len(mb)+1) <= maxCommonCells {
		// lcs[i][j]: length of a longest common subsequence of ma[i:] and mb[j:].
		// Most middles are an element or two (a changed container): their
		// table fits on the stack.
		w := len(mb) + 1
		var small [64]int32
		var lcs []int32
		if cells := (len(ma) + 1) * w; cells <= len(small) {
			lcs = small[:cells]
		} else {
			lcs = make([]int32, cells)
		}
		for i := len(ma) - 1; i >= 0; i-- {
			for j := len(mb) - 1; j >= 0; j-- {
				switch {
				case bytes.Equal(ma[i], mb[j]):
					lcs[i*w+j] = lcs[(i+1)*w+j+1] + 1
				case lcs[(i+1)*w+j] >= lcs[i*w+j+1]:
					lcs[i*w+j] = lcs[(i+1)*w+j]
				default:
					lcs[i*w+j] = lcs[i*w+j+1]
				}
			}
		}
		for i, j := 0, 0; i < len(ma) && j < len(mb); {
			switch {
			case bytes.Equal(ma[i], mb[j]):
				kept = append(kept, pair{pre + i, pre + j})
				i++
				j++
			case lcs[(i+1)*w+j] >= lcs[i*w+j+1]:
				i++
			default:
				j++
			}
		}
	}
	for k := suf; k > 0; k-- {
		kept = append(kept, pair{len(ea) - k, len(eb) - k})
	}
	return kept
}

func (d *differ) pathError(err error) error {
	return fmt.Errorf("json patch: at %q: %w", d.path, err)
}

// appendKey appends key to the JSON pointer p. RFC 6901 section 4: "~" is
// written "~0" and "/" "~1" in a reference token.
func appendKey(p, key []byte) []byte {
	p = append(p, '/')
	for _, c := range key {
		switch c {
		case '~':
			p = append(p, "~0"...)
		case '/':
			p = append(p, "~1"...)
		default:
			p = append(p, c)
		}
	}
	return p
}

func appendIndex(p []byte, i int) []byte { return strconv.AppendInt(append(p, '/'), int64(i), 10) }

type kind int

const (
	kindObject kind = iota
	kindArray
	kindString
	kindBool
	kindNull
	kindNumber
)

// kindOf tells a value's JSON type from its first byte.
func kindOf(c byte) kind {
	switch c {
	case '{':
		return kindObject
	case '[':
		return kindArray
	case '"':
		return kindString
	case 't', 'f':
		return kindBool
	case 'n':
		return kindNull
	}
	return kindNumber
}

type member struct {
	key   []byte // decoded: the bytes between the quotes, unless they hold escapes
	value []byte
	hash  uint32 // of key, worked out once for both objects' keyIndex
}

// appendMembers splits an object into its members, in document order, and
// appends them to ms.
func (t *text) appendMembers(ms []member, obj []byte) ([]member, error) {
	i := skipSpace(obj, 1)
	if i < len(obj) && obj[i] == '}' {
		return ms, checkEnd(obj, i+1)
	}
	for {
		if i >= len(obj) || obj[i] != '"' {
			return nil, errors.New("object key expected")
		}
		end, err := skipString(obj, i)
		if err != nil {
			return nil, err
		}
		key, err := decodeKey(obj[i:end])
		if err != nil {
			return nil, err
		}
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return nil, errors.New("':' expected after object key")
		}
		start := skipSpace(obj, i+1)
		if end, err = t.skipValue(obj, start); err != nil {
			return nil, err
		}
		ms = append(ms, member{key: key, value: obj[start:end], hash: hashKey(key)})
		i = skipSpace(obj, end)
		if i < len(obj) && obj[i] == ',' {
			i = skipSpace(obj, i+1)
			continue
		}
		if i < len(obj) && obj[i] == '}' {
			return ms, checkEnd(obj, i+1)
		}
		return nil, errors.New("',' or '}' expected in object")
	}
}

// appendElements splits a list into its elements and appends them to es.
func (t *text) appendElements(es [][]byte, list []byte) ([][]byte, error) {
	i := skipSpace(list, 1)
	if i < len(list) && list[i] == ']' {
		return es, checkEnd(list, i+1)
	}
	for {
		end, err := t.skipValue(list, i)
		if err != nil {
			return nil, err
		}
		es = append(es, list[i:end])
		i = skipSpace(list, end)
		if i < len(list) && list[i] == ',' {
			i = skipSpace(list, i+1)
			continue
		}
		if i < len(list) && list[i] == ']' {
			return es, checkEnd(list, i+1)
		}
		return nil, errors.New("',' or ']' expected in list")
	}
}

func checkEnd(v []byte, i int) error {
	if i != len(v) {
		return errors.New("unexpected data after value")
	}
	return nil
}

// decodeKey decodes a quoted object key; most need no unescaping.
func decodeKey(quoted []byte) ([]byte, error) {
	raw := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return raw, nil
	}
	var s string
	err := json.Unmarshal(quoted, &s)
	return []byte(s), err
}

func skipSpace(v []byte, i int) int {
	for i < len(v) && (v[i] == ' ' || v[i] == '\t' || v[i] == '\n' || v[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just after the string that starts at v[i].
func skipString(v []byte, i int) (int, error) {
	for j := i + 1; j < len(v); {
		k := bytes.IndexByte(v[j:], '"')
		if k < 0 {
			break
		}
		j += k
		// The quote ends the string unless an odd number of backslashes escape it.
		bs := 0
		for v[j-1-bs] == '\\' {
			bs++
		}
		if bs%2 == 0 {
			return j + 1, nil
		}
		j++
	}
	return 0, errors.New("unterminated string")
}

// text is a JSON document with the end of each of its objects and lists,
// found in one pass, so that skipping a nested value does not scan it again
// at every level the diff walks down.
type text struct {
	data []byte
	// The objects and lists of data, in document order.
	spans []span
}

// span is where an object or list starts in its text, and where it ends
// (just after its closing bracket).
type span struct{ start, end int32 }

// index finds the objects and lists of data.
func (t *text) index(data []byte) error {
	if len(data) > math.MaxInt32 {
		return errors.New("document too large")
	}
	t.data, t.spans = data, t.spans[:0]
	var openBuf [32]int32
	open := openBuf[:0] // indexes into spans of the objects and lists not yet closed
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '"':
			end, err := skipString(data, i)
			if err != nil {
				return err
			}
			i = end - 1
		case '{', '[':
			open = append(open, int32(len(t.spans)))
			t.spans = append(t.spans, span{start: int32(i)})
		case '}', ']':
			if len(open) == 0 {
				return fmt.Errorf("unexpected %q", c)
			}
			k := open[len(open)-1]
			if (c == '}') != (data[t.spans[k].start] == '{') {
				return fmt.Errorf("unexpected %q", c)
			}
			t.spans[k].end = int32(i + 1)
			open = open[:len(open)-1]
		}
	}
	if len(open) > 0 {
		return errors.New("unterminated object or list")
	}
	return nil
}

// offset is where v, which was sliced from t.data, starts in it.
func (t *text) offset(v []byte) int { return cap(t.data) - cap(v) }

// skipValue returns the index just after the value that starts at v[i].
func (t *text) skipValue(v []byte, i int) (int, error) {
	if i >= len(v) {
		return 0, errors.New("value expected")
	}
	switch v[i] {
	case '"':
		return skipString(v, i)
	case '{', '[':
		base := t.offset(v)
		k, found := slices.BinarySearchFunc(t.spans, int32(base+i), func(s span, start int32) int {
			return cmp.Compare(s.start, start)
		})
		if !found {
			return 0, errors.New("unindexed object or list")
		}
		return int(t.spans[k].end) - base, nil
	case ',', ':', '}', ']':
		return 0, errors.New("value expected")
	}
	// A number or literal: up to the next delimiter.
	j := i
	for ; j < len(v); j++ {
		switch v[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j, nil
		}
	}
	return j, nil
}

// Marshal encodes a patch as json.Marshal does, but copies json.RawMessage
// values (Create's) as they are instead of checking and compacting each one
// again (json.Marshal would also escape <, > and & in them for HTML, which
// json.Marshal did already where they come from), which is most of the cost
// of encoding a patch that adds containers. Such values must be valid JSON,
// as json.RawMessage demands.
//
// controller-runtime's Response.Complete encodes Response.Patches with
// json.Marshal unless they are left empty and Response.Patch is set instead.
func Marshal(ops []Operation) ([]byte, error) {
	size := 2
	for _, op := range ops {
		size += len(`{"op":"","path":"","value":},`) + len(op.Operation) + len(op.Path) + 8
		if raw, ok := op.Value.(json.RawMessage); ok {
			size += len(raw)
		}
	}
	buf := make([]byte, 0, size)
	buf = append(buf, '[')
	for i, op := range ops {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"op":`...)
		buf = appendString(buf, op.Operation)
		buf = append(buf, `,"path":`...)
		buf = appendString(buf, op.Path)
		// As gomodules' Operation.MarshalJSON: add and replace always carry a
		// value (null too), other operations only a non-nil one.
		if op.Value == nil && op.Operation != "add" && op.Operation != "replace" {
			buf = append(buf, '}')
			continue
		}
		buf = append(buf, `,"value":`...)
		if raw, ok := op.Value.(json.RawMessage); ok && len(raw) > 0 {
			buf = append(buf, raw...)
		} else {
			b, err := json.Marshal(op.Value)
			if err != nil {
				return nil, fmt.Errorf("json patch: value at %q: %w", op.Path, err)
			}
			buf = append(buf, b...)
		}
		buf = append(buf, '}')
	}
	return append(buf, ']'), nil
}

// appendString appends s as a JSON string.
func appendString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always encodes
			return append(buf, b...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}
