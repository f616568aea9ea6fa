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
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

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
	ta, err := newText(a)
	if err != nil {
		return nil, fmt.Errorf("json patch: first document: %w", err)
	}
	tb, err := newText(b)
	if err != nil {
		return nil, fmt.Errorf("json patch: second document: %w", err)
	}
	d := differ{a: ta, b: tb}
	return d.diff(a, b, "", []Operation{})
}

// differ walks a value of text a and a value of text b side by side.
type differ struct{ a, b *text }

// diff appends the operations that turn value a into value b at path p.
func (d differ) diff(a, b []byte, p string, ops []Operation) ([]Operation, error) {
	if bytes.Equal(a, b) {
		return ops, nil
	}
	ka, kb := kindOf(a[0]), kindOf(b[0])
	if ka != kb {
		return append(ops, gomodules.NewOperation("replace", p, json.RawMessage(b))), nil
	}
	switch ka {
	case kindObject:
		return d.diffObjects(a, b, p, ops)
	case kindArray:
		return d.diffArrays(a, b, p, ops)
	case kindString:
		var sa, sb string
		if err := json.Unmarshal(a, &sa); err != nil {
			return nil, pathError(p, err)
		}
		if err := json.Unmarshal(b, &sb); err != nil {
			return nil, pathError(p, err)
		}
		if sa == sb {
			return ops, nil
		}
	}
	// Different strings, numbers or booleans (equal ones had equal bytes,
	// and null has only one spelling).
	return append(ops, gomodules.NewOperation("replace", p, json.RawMessage(b))), nil
}

func (d differ) diffObjects(a, b []byte, p string, ops []Operation) ([]Operation, error) {
	ma, err := d.a.members(a)
	if err != nil {
		return nil, pathError(p, err)
	}
	mb, err := d.b.members(b)
	if err != nil {
		return nil, pathError(p, err)
	}
	// Of duplicate keys the last wins, as in encoding/json.
	var slotsA, slotsB [64]int32
	ia, ib := newKeyIndex(ma, slotsA[:]), newKeyIndex(mb, slotsB[:])
	for i, m := range mb {
		if ib.last(m.key) != i {
			continue
		}
		j := ia.last(m.key)
		if j < 0 {
			ops = append(ops, gomodules.NewOperation("add", makePath(p, m.key), json.RawMessage(m.value)))
			continue
		}
		if bytes.Equal(ma[j].value, m.value) {
			continue // the common case: skip it before building its path
		}
		if ops, err = d.diff(ma[j].value, m.value, makePath(p, m.key), ops); err != nil {
			return nil, err
		}
	}
	for j, m := range ma {
		if ia.last(m.key) == j && ib.last(m.key) < 0 {
			ops = append(ops, gomodules.NewOperation("remove", makePath(p, m.key), nil))
		}
	}
	return ops, nil
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
		h := x.find(m.key)
		x.slots[h] = int32(i + 1) // a later duplicate replaces an earlier one
	}
	return x
}

// find returns the slot of key, or the empty slot where it would go.
func (x keyIndex) find(key []byte) int {
	mask := uint32(len(x.slots) - 1)
	h := uint32(2166136261) // FNV-1a
	for _, c := range key {
		h = (h ^ uint32(c)) * 16777619
	}
	for h &= mask; ; h = (h + 1) & mask {
		if s := x.slots[h]; s == 0 || bytes.Equal(x.ms[s-1].key, key) {
			return int(h)
		}
	}
}

// last returns the index of the last member with key, or -1.
func (x keyIndex) last(key []byte) int {
	return int(x.slots[x.find(key)]) - 1
}

// diffArrays keeps the elements that are equal in both lists where they
// are, and compares the ones between two kept elements position by position:
// the pairs recursively, then the surplus removed or added.
func (d differ) diffArrays(a, b []byte, p string, ops []Operation) ([]Operation, error) {
	ea, err := d.a.elements(a)
	if err != nil {
		return nil, pathError(p, err)
	}
	eb, err := d.b.elements(b)
	if err != nil {
		return nil, pathError(p, err)
	}
	kept := commonElements(ea, eb)
	// From the last gap to the first: operations at one index do not move
	// the elements before it, so every gap starts at its index in a.
	endA, endB := len(ea), len(eb)
	for k := len(kept); k >= 0; k-- {
		startA, startB := 0, 0
		if k > 0 {
			startA, startB = kept[k-1].a+1, kept[k-1].b+1
		}
		if ops, err = d.diffGap(ea[startA:endA], eb[startB:endB], startA, p, ops); err != nil {
			return nil, err
		}
		if k > 0 {
			endA, endB = kept[k-1].a, kept[k-1].b
		}
	}
	return ops, nil
}

// diffGap compares the elements ga, at index at of the list at p, with gb
// position by position, as gomodules compares whole lists.
func (d differ) diffGap(ga, gb [][]byte, at int, p string, ops []Operation) ([]Operation, error) {
	n := min(len(ga), len(gb))
	for i := len(ga) - 1; i >= n; i-- {
		ops = append(ops, gomodules.NewOperation("remove", makeIndexPath(p, at+i), nil))
	}
	for i := n; i < len(gb); i++ {
		ops = append(ops, gomodules.NewOperation("add", makeIndexPath(p, at+i), json.RawMessage(gb[i])))
	}
	var err error
	for i := range n {
		if bytes.Equal(ga[i], gb[i]) {
			continue
		}
		if ops, err = d.diff(ga[i], gb[i], makeIndexPath(p, at+i), ops); err != nil {
			return nil, err
		}
	}
	return ops, nil
}

// pair is an element at index a of one list and b of the other.
type pair struct{ a, b int }

// maxCommonCells bounds the table of commonElements (int32 cells): lists
// whose differing middles are larger are compared position by position.
const maxCommonCells = 1 << 14

// commonElements returns a longest run of elements (by their bytes) that
// both lists have in the same order: the common beginning and end, and
// between them a longest common subsequence.
func commonElements(ea, eb [][]byte) []pair {
	var kept []pair
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
		w := len(mb) + 1
		lcs := make([]int32, (len(ma)+1)*w)
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

func pathError(p string, err error) error {
	return fmt.Errorf("json patch: at %q: %w", p, err)
}

// makePath appends key to the JSON pointer p. RFC 6901 section 4: "~" is
// written "~0" and "/" "~1" in a reference token.
func makePath(p string, key []byte) string {
	var b strings.Builder
	b.Grow(len(p) + 1 + len(key) + 4)
	b.WriteString(p)
	b.WriteByte('/')
	for _, c := range key {
		switch c {
		case '~':
			b.WriteString("~0")
		case '/':
			b.WriteString("~1")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func makeIndexPath(p string, i int) string { return p + "/" + strconv.Itoa(i) }

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
}

// members splits an object into its members, in document order.
func (t *text) members(obj []byte) ([]member, error) {
	ms := make([]member, 0, 8)
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
		ms = append(ms, member{key: key, value: obj[start:end]})
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

// elements splits a list into its elements.
func (t *text) elements(list []byte) ([][]byte, error) {
	es := make([][]byte, 0, 8)
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
	// The offsets in data where each object and list starts, in document
	// order, and where it ends (just after its closing bracket).
	starts, ends []int32
}

func newText(data []byte) (*text, error) {
	if len(data) > math.MaxInt32 {
		return nil, errors.New("document too large")
	}
	t := &text{data: data, starts: make([]int32, 0, len(data)/32), ends: make([]int32, 0, len(data)/32)}
	var open []int // indexes into starts of the objects and lists not yet closed
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '"':
			end, err := skipString(data, i)
			if err != nil {
				return nil, err
			}
			i = end - 1
		case '{', '[':
			open = append(open, len(t.starts))
			t.starts = append(t.starts, int32(i))
			t.ends = append(t.ends, 0)
		case '}', ']':
			if len(open) == 0 {
				return nil, fmt.Errorf("unexpected %q", c)
			}
			k := open[len(open)-1]
			if (c == '}') != (data[t.starts[k]] == '{') {
				return nil, fmt.Errorf("unexpected %q", c)
			}
			t.ends[k] = int32(i + 1)
			open = open[:len(open)-1]
		}
	}
	if len(open) > 0 {
		return nil, errors.New("unterminated object or list")
	}
	return t, nil
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
		k, found := slices.BinarySearch(t.starts, int32(base+i))
		if !found {
			return 0, errors.New("unindexed object or list")
		}
		return int(t.ends[k]) - base, nil
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
