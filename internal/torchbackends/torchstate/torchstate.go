// Package torchstate reads the state torch's dynamic rendezvous (the etcd-v2
// and c10d backends) keeps in its store: a pickled _RendezvousState, base64
// encoded. It is what a job-level view of the rendezvous needs (round, who is
// in it, who is alive) without running Python.
//
// Pickles are code, so only the classes torch writes there are accepted
// (torch's two classes, datetime and the builtins pickle needs); anything else
// is refused, as the preStop script does.
package torchstate

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// MaxStateLen bounds what Decode reads. A state holds a few hundred bytes per
// node; 16 MiB is tens of thousands of nodes, and keeps a bad value from
// costing more memory than that.
const MaxStateLen = 16 << 20

// The keys torch's dynamic rendezvous keeps its pickled state under (base64
// of the pickle): etcd_rendezvous_backend's v2 key and
// c10d_rendezvous_backend's store key (torch's TCPStore client puts a "/"
// in front of it on the wire), each followed by the run id. C10dKeyPrefix
// also begins the keys of each round's store.
const (
	V2KeyPrefix   = "/torch/elastic/rendezvous/"
	C10dKeyPrefix = "torch.rendezvous."
)

// StateRun says whether key (as torch names it, without the TCPStore's "/")
// is where backend (constants.BackendEtcdV2 or BackendC10d) keeps a run's
// state, and which run.
func StateRun(backend, key string) (string, bool) {
	prefix := V2KeyPrefix
	if backend == constants.BackendC10d {
		prefix = C10dKeyPrefix
	}
	run, ok := strings.CutPrefix(key, prefix)
	if !ok || run == "" || strings.Contains(run, "/") {
		return "", false
	}
	return run, true
}

// Node is torch's _NodeDesc: one agent (torchrun process).
type Node struct {
	Addr    string
	PID     int
	LocalID int
}

// String is torch's own name for the node (_NodeDesc.__repr__).
func (n Node) String() string { return fmt.Sprintf("%s_%d_%d", n.Addr, n.PID, n.LocalID) }

// Participant is a node of the current round with its rank in the round.
type Participant struct {
	Node
	Rank int
}

// State is the part of _RendezvousState a view of the job needs.
type State struct {
	Round    int
	Complete bool
	Closed   bool
	// Participants of the current round, by rank.
	Participants []Participant
	// Waiting are the nodes that asked to join the next round.
	Waiting []Node
	// Heartbeats is each node's last keep-alive, in UTC.
	Heartbeats map[Node]time.Time
}

// DecodeBase64 decodes the value as the backends store it.
func DecodeBase64(b []byte) (State, error) {
	if base64.StdEncoding.DecodedLen(len(b)) > MaxStateLen {
		return State{}, fmt.Errorf("rendezvous state of %d bytes: over the limit of %d", len(b), MaxStateLen)
	}
	raw := make([]byte, base64.StdEncoding.DecodedLen(len(b)))
	n, err := base64.StdEncoding.Decode(raw, b)
	if err != nil {
		return State{}, fmt.Errorf("rendezvous state is not base64: %w", err)
	}
	return Decode(raw[:n])
}

// Decode reads a pickled _RendezvousState. Its errors quote at most a short
// prefix of the input.
func Decode(raw []byte) (State, error) {
	st, err := decode(raw)
	if err != nil {
		return State{}, shortError{err}
	}
	return st, nil
}

func decode(raw []byte) (State, error) {
	obj, err := load(raw)
	if err != nil {
		return State{}, err
	}
	return fromObject(obj)
}

// load unpickles a _RendezvousState into its generic form, which Encode
// writes back.
func load(raw []byte) (obj *object, err error) {
	if len(raw) > MaxStateLen {
		return nil, fmt.Errorf("rendezvous state of %d bytes: over the limit of %d", len(raw), MaxStateLen)
	}
	// gopickle trusts the stack's shape (a malformed pickle can make it index
	// out of range); a bad value must be an error, never a crash.
	defer func() {
		if r := recover(); r != nil {
			obj, err = nil, fmt.Errorf("malformed pickle: %v", r)
		}
	}()
	if err := checkLengths(raw); err != nil {
		return nil, fmt.Errorf("unpickle rendezvous state: %w", err)
	}
	u := pickle.NewUnpickler(bytes.NewReader(raw))
	u.FindClass = findClass
	v, err := u.Load()
	if err != nil {
		return nil, fmt.Errorf("unpickle rendezvous state: %w", err)
	}
	obj, ok := v.(*object)
	if !ok || obj.class.name != stateClass {
		return nil, fmt.Errorf("not a %s: %T", stateClass, v)
	}
	return obj, nil
}

// maxErrorLen bounds an error's text: gopickle's errors may hold a whole
// argument of the input, and the error reaches logs and /rendezvous.
const maxErrorLen = 300

type shortError struct{ err error }

func (e shortError) Error() string {
	msg := e.err.Error()
	if len(msg) > maxErrorLen {
		msg = strings.ToValidUTF8(msg[:maxErrorLen], "") + fmt.Sprintf("... (%d bytes)", len(msg))
	}
	return msg
}

func (e shortError) Unwrap() error { return e.err }

// quote is a string from the input as an error shows it: as it is when short
// and printable, else quoted and cut to 64 bytes.
func quote(s string) string {
	switch {
	case len(s) > 64:
		return fmt.Sprintf("%.64q... (%d bytes)", s, len(s))
	case strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return strconv.Quote(s)
	}
	return s
}

const (
	torchModule = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
	stateClass  = "_RendezvousState"
	nodeClass   = "_NodeDesc"
)

func findClass(module, name string) (any, error) {
	switch {
	case module == torchModule && (name == stateClass || name == nodeClass):
		return &class{name: name}, nil
	case module == "datetime" && name == "datetime":
		return datetimeClass{}, nil
	case module == "datetime" && name == "timezone":
		return timezoneClass{}, nil
	case module == "datetime" && name == "timedelta":
		return timedeltaClass{}, nil
	case module == "builtins" && name == "set":
		return setClass{}, nil
	}
	return nil, fmt.Errorf("refusing %s: not a class torch's rendezvous state uses", quote(module+"."+name))
}

// class stands for one of torch's two classes; pickle makes instances with
// NEWOBJ and fills them with BUILD (their __dict__).
type class struct{ name string }

func (c *class) PyNew(args ...any) (any, error) {
	return &object{class: c, attrs: map[string]any{}}, nil
}

type object struct {
	class *class
	attrs map[string]any
	order []string // attribute names in the order the pickle set them
}

func (o *object) PyDictSet(key, value any) error {
	k, ok := key.(string)
	if !ok {
		return fmt.Errorf("%s: attribute name %T", o.class.name, key)
	}
	if _, seen := o.attrs[k]; !seen {
		o.order = append(o.order, k)
	}
	o.attrs[k] = value
	return nil
}

// datetimeClass rebuilds datetime.datetime from its pickled bytes (REDUCE).
type datetimeClass struct{}

func (datetimeClass) Call(args ...any) (any, error) {
	if len(args) < 1 {
		return nil, errors.New("datetime: no arguments")
	}
	var b []byte
	switch v := args[0].(type) {
	case []byte:
		b = v
	case string: // protocol 2 pickles bytes as latin-1 text
		for _, r := range v {
			b = append(b, byte(r))
		}
	}
	if len(b) != 10 {
		return nil, fmt.Errorf("datetime: %d bytes of state, want 10", len(b))
	}
	us := int(b[7])<<16 | int(b[8])<<8 | int(b[9])
	t := time.Date(int(b[0])<<8|int(b[1]), time.Month(b[2]&0x7f), int(b[3]), int(b[4]), int(b[5]), int(b[6]),
		us*1000, naive)
	if len(args) > 1 { // tzinfo: torch 2.x writes datetime.now(timezone.utc), 1.13 naive UTC
		tz, ok := args[1].(offset)
		if !ok {
			return nil, fmt.Errorf("datetime: tzinfo %T", args[1])
		}
		t = t.Add(-time.Duration(tz)).In(time.UTC)
	}
	return t, nil
}

// naive is the location of a datetime pickled without tzinfo (UTC, as torch
// 1.13 wrote them): its instant is UTC's, and Encode writes it back naive, as
// Python cannot compare a naive datetime with an aware one.
var naive = time.FixedZone("UTC", 0)

// offset is a datetime.timezone (its UTC offset) or a datetime.timedelta.
type offset time.Duration

type timezoneClass struct{}

func (timezoneClass) Call(args ...any) (any, error) {
	if len(args) < 1 {
		return nil, errors.New("timezone: no offset")
	}
	d, ok := args[0].(offset)
	if !ok {
		return nil, fmt.Errorf("timezone: offset %T", args[0])
	}
	return d, nil
}

type timedeltaClass struct{}

func (timedeltaClass) Call(args ...any) (any, error) {
	var parts [3]int // days, seconds, microseconds
	for i, a := range args {
		n, ok := asInt(a)
		if !ok || i >= len(parts) {
			return nil, fmt.Errorf("timedelta: argument %d: %T", i, a)
		}
		parts[i] = n
	}
	return offset(time.Duration(parts[0])*24*time.Hour + time.Duration(parts[1])*time.Second +
		time.Duration(parts[2])*time.Microsecond), nil
}

// setClass: older protocols pickle a set as set([...]).
type setClass struct{}

func (setClass) Call(args ...any) (any, error) {
	s := types.NewSet()
	if len(args) == 1 {
		l, ok := args[0].(*types.List)
		if !ok {
			return nil, fmt.Errorf("set(%T)", args[0])
		}
		for _, v := range *l {
			s.Add(v)
		}
	}
	return s, nil
}

func fromObject(o *object) (State, error) {
	var st State
	var err error
	if st.Round, err = intAttr(o, "round"); err != nil {
		return State{}, err
	}
	st.Complete, _ = o.attrs["complete"].(bool)
	st.Closed, _ = o.attrs["closed"].(bool)
	if d, ok := o.attrs["participants"].(*types.Dict); ok {
		for _, e := range *d {
			n, err := node(e.Key)
			if err != nil {
				return State{}, err
			}
			rank, ok := asInt(e.Value)
			if !ok {
				return State{}, fmt.Errorf("participants: rank %T", e.Value)
			}
			st.Participants = append(st.Participants, Participant{Node: n, Rank: rank})
		}
	}
	slices.SortFunc(st.Participants, func(a, b Participant) int { return a.Rank - b.Rank })
	if s, ok := o.attrs["wait_list"].(*types.Set); ok {
		for v := range *s {
			n, err := node(v)
			if err != nil {
				return State{}, err
			}
			st.Waiting = append(st.Waiting, n)
		}
	}
	slices.SortFunc(st.Waiting, func(a, b Node) int { return strings.Compare(a.String(), b.String()) })
	st.Heartbeats = map[Node]time.Time{}
	if d, ok := o.attrs["last_heartbeats"].(*types.Dict); ok {
		for _, e := range *d {
			n, err := node(e.Key)
			if err != nil {
				return State{}, err
			}
			if t, ok := e.Value.(time.Time); ok {
				st.Heartbeats[n] = t
			}
		}
	}
	return st, nil
}

func node(v any) (Node, error) {
	o, ok := v.(*object)
	if !ok || o.class.name != nodeClass {
		return Node{}, fmt.Errorf("want a %s, got %T", nodeClass, v)
	}
	addr, ok := o.attrs["addr"].(string)
	if !ok {
		return Node{}, fmt.Errorf("%s without addr", nodeClass)
	}
	pid, err := intAttr(o, "pid")
	if err != nil {
		return Node{}, err
	}
	local, err := intAttr(o, "local_id")
	if err != nil {
		return Node{}, err
	}
	return Node{Addr: addr, PID: pid, LocalID: local}, nil
}

func intAttr(o *object, name string) (int, error) {
	n, ok := asInt(o.attrs[name])
	if !ok {
		return 0, fmt.Errorf("%s.%s: want an int, got %T", o.class.name, name, o.attrs[name])
	}
	return n, nil
}

func asInt(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	}
	return 0, false
}
