package torchstate

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/nlpodyssey/gopickle/types"
)

// The serving sidecar changes torch's state in one way only: it puts a node
// of its own on the wait list, which is what makes every agent of a
// completed round restart its workers (torch's agents look at nothing else),
// and takes it off again. Everything else in the state is written back as
// torch wrote it.

// WithWaiting returns the base64 state b with n on the wait list and a
// heartbeat of at (so that torch's own _sanitize drops it if it is left
// there). The heartbeat is naive or aware as the state's other times are.
func WithWaiting(b []byte, n Node, at time.Time) ([]byte, error) {
	return edit(b, func(o *object) error {
		hb, wait, err := waitAttrs(o)
		if err != nil {
			return err
		}
		loc := time.UTC
		for _, e := range *hb {
			if t, ok := e.Value.(time.Time); ok && t.Location() == naive {
				loc = naive
			}
		}
		removeNode(hb, wait, n)
		node := newNode(n)
		wait.Add(node)
		hb.Set(node, at.In(loc).Truncate(time.Microsecond))
		return nil
	})
}

// WithoutParticipants returns the base64 state b of a completed round without
// the participants whose address lost says is lost (and their heartbeats), as
// torch's _sanitize drops a dead node; dropped are the nodes taken out (none:
// b unchanged). The survivors are asked to restart with n on the wait list, as
// WithWaiting puts it. With no participant left, the round ends as torch's
// _remove_participant_epilogue ends it (the next round, not complete) and the
// agents waiting join that.
func WithoutParticipants(b []byte, lost func(addr string) bool, n Node, at time.Time) (out []byte, dropped []Node, err error) {
	left := 0
	out, err = edit(b, func(o *object) error {
		parts, err := dictAttr(o, "participants")
		if err != nil {
			return err
		}
		hb, err := dictAttr(o, "last_heartbeats")
		if err != nil {
			return err
		}
		*parts = slices.DeleteFunc(*parts, func(e types.DictEntry) bool {
			k, err := node(e.Key)
			if err == nil && lost(k.Addr) {
				dropped = append(dropped, k)
				return true
			}
			return false
		})
		*hb = slices.DeleteFunc(*hb, func(e types.DictEntry) bool {
			k, err := node(e.Key)
			return err == nil && slices.Contains(dropped, k)
		})
		if left = len(*parts); left == 0 && len(dropped) > 0 {
			round, err := intAttr(o, "round")
			if err != nil {
				return err
			}
			o.attrs["complete"], o.attrs["round"] = false, round+1
		}
		return nil
	})
	if err != nil || len(dropped) == 0 {
		return b, nil, err
	}
	if left > 0 {
		out, err = WithWaiting(out, n, at)
	}
	return out, dropped, err
}

// WithoutWaiting returns the base64 state b with n neither on the wait list
// nor among the heartbeats.
func WithoutWaiting(b []byte, n Node) ([]byte, error) {
	return edit(b, func(o *object) error {
		hb, wait, err := waitAttrs(o)
		if err != nil {
			return err
		}
		removeNode(hb, wait, n)
		return nil
	})
}

// EncodeBase64 pickles st as torch 2.x would store it (times aware, no
// deadline, no redundancy list): states for tests and benchmarks that run
// without torch.
func EncodeBase64(st State) ([]byte, error) {
	participants, waiting, heartbeats, none := types.NewDict(), types.NewSet(), types.NewDict(), types.NewSet()
	for _, p := range st.Participants {
		participants.Set(newNode(p.Node), p.Rank)
	}
	for _, n := range st.Waiting {
		waiting.Add(newNode(n))
	}
	nodes := slices.Collect(maps.Keys(st.Heartbeats))
	slices.SortFunc(nodes, func(a, b Node) int { return strings.Compare(a.String(), b.String()) })
	for _, n := range nodes {
		heartbeats.Set(newNode(n), st.Heartbeats[n].UTC())
	}
	o := &object{class: &class{name: stateClass},
		order: []string{"round", "complete", "deadline", "closed", "participants", "wait_list", "redundancy_list", "last_heartbeats"},
		attrs: map[string]any{"round": st.Round, "complete": st.Complete, "deadline": nil, "closed": st.Closed,
			"participants": participants, "wait_list": waiting, "redundancy_list": none, "last_heartbeats": heartbeats}}
	raw, err := encode(o)
	if err != nil {
		return nil, err
	}
	return base64.StdEncoding.AppendEncode(nil, raw), nil
}

func edit(b []byte, change func(*object) error) ([]byte, error) {
	raw, err := base64.StdEncoding.AppendDecode(nil, b)
	if err != nil {
		return nil, fmt.Errorf("rendezvous state is not base64: %w", err)
	}
	o, err := load(raw)
	if err != nil {
		return nil, shortError{err}
	}
	if err := change(o); err != nil {
		return nil, err
	}
	out, err := encode(o)
	if err != nil {
		return nil, err
	}
	return base64.StdEncoding.AppendEncode(nil, out), nil
}

// waitAttrs are the state's heartbeats and wait list, which a node on the
// wait list is in both of.
func waitAttrs(o *object) (*types.Dict, *types.Set, error) {
	hb, err := dictAttr(o, "last_heartbeats")
	if err != nil {
		return nil, nil, err
	}
	wait, err := setAttr(o, "wait_list")
	return hb, wait, err
}

func dictAttr(o *object, name string) (*types.Dict, error) {
	d, ok := o.attrs[name].(*types.Dict)
	if !ok {
		return nil, fmt.Errorf("%s.%s: want a dict, got %T", o.class.name, name, o.attrs[name])
	}
	return d, nil
}

func setAttr(o *object, name string) (*types.Set, error) {
	s, ok := o.attrs[name].(*types.Set)
	if !ok {
		return nil, fmt.Errorf("%s.%s: want a set, got %T", o.class.name, name, o.attrs[name])
	}
	return s, nil
}

func newNode(n Node) *object {
	return &object{class: &class{name: nodeClass}, order: []string{"addr", "pid", "local_id"},
		attrs: map[string]any{"addr": n.Addr, "pid": n.PID, "local_id": n.LocalID}}
}

// removeNode takes n out of the heartbeats and the wait list. Nodes are
// objects, equal by value as torch's frozen dataclass is.
func removeNode(hb *types.Dict, wait *types.Set, n Node) {
	*hb = slices.DeleteFunc(*hb, func(e types.DictEntry) bool {
		k, err := node(e.Key)
		return err == nil && k == n
	})
	for v := range *wait {
		if k, err := node(v); err == nil && k == n {
			delete(*wait, v)
		}
	}
}

// Pickle opcodes (Python's Lib/pickle.py), protocol 4.
const (
	opProto          = 0x80
	opStop           = '.'
	opGlobal         = 'c'
	opEmptyTuple     = ')'
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opNewObj         = 0x81
	opReduce         = 'R'
	opBuild          = 'b'
	opMark           = '('
	opEmptyDict      = '}'
	opSetItems       = 'u'
	opEmptySet       = 0x8f
	opAddItems       = 0x90
	opNone           = 'N'
	opNewTrue        = 0x88
	opNewFalse       = 0x89
	opBinInt         = 'J'
	opLong1          = 0x8a
	opShortBinUni    = 0x8c
	opBinUnicode     = 'X'
	opShortBinBytes  = 'C'
	datetimeStateLen = 10
)

// encode pickles a state that load read (protocol 4, without frames or memo,
// which unpickling does not need).
func encode(o *object) ([]byte, error) {
	var w bytes.Buffer
	w.Write([]byte{opProto, 4})
	if err := encodeValue(&w, o); err != nil {
		return nil, err
	}
	w.WriteByte(opStop)
	return w.Bytes(), nil
}

func encodeValue(w *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		w.WriteByte(opNone)
	case bool:
		w.WriteByte(map[bool]byte{true: opNewTrue, false: opNewFalse}[v])
	case int:
		encodeInt(w, big.NewInt(int64(v)))
	case int64:
		encodeInt(w, big.NewInt(v))
	case *big.Int:
		encodeInt(w, v)
	case string:
		encodeString(w, v)
	case time.Time:
		encodeDatetime(w, v)
	case *object:
		encodeGlobal(w, torchModule, v.class.name)
		w.Write([]byte{opEmptyTuple, opNewObj, opEmptyDict, opMark})
		for _, k := range v.order {
			encodeString(w, k)
			if err := encodeValue(w, v.attrs[k]); err != nil {
				return fmt.Errorf("%s.%s: %w", v.class.name, k, err)
			}
		}
		w.Write([]byte{opSetItems, opBuild})
	case *types.Dict:
		w.Write([]byte{opEmptyDict, opMark})
		for _, e := range *v {
			if err := encodeValue(w, e.Key); err != nil {
				return err
			}
			if err := encodeValue(w, e.Value); err != nil {
				return err
			}
		}
		w.WriteByte(opSetItems)
	case *types.Set:
		// A set has no order; sorting the nodes by torch's own name for them
		// makes the same state encode to the same bytes.
		items := make([]any, 0, len(*v))
		for x := range *v {
			items = append(items, x)
		}
		slices.SortFunc(items, func(a, b any) int { return strings.Compare(fmt.Sprint(nodeName(a)), fmt.Sprint(nodeName(b))) })
		w.Write([]byte{opEmptySet, opMark})
		for _, x := range items {
			if err := encodeValue(w, x); err != nil {
				return err
			}
		}
		w.WriteByte(opAddItems)
	default:
		return fmt.Errorf("cannot pickle %T", v)
	}
	return nil
}

func nodeName(v any) any {
	if n, err := node(v); err == nil {
		return n.String()
	}
	return v
}

func encodeGlobal(w *bytes.Buffer, module, name string) {
	w.WriteByte(opGlobal)
	w.WriteString(module + "\n" + name + "\n")
}

func encodeString(w *bytes.Buffer, s string) {
	if len(s) < 256 {
		w.Write([]byte{opShortBinUni, byte(len(s))})
	} else {
		w.WriteByte(opBinUnicode)
		w.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(s))))
	}
	w.WriteString(s)
}

// encodeInt writes BININT when it fits, else LONG1 (two's complement, little
// endian), as pickle does.
func encodeInt(w *bytes.Buffer, n *big.Int) {
	if n.IsInt64() && n.Int64() >= math.MinInt32 && n.Int64() <= math.MaxInt32 {
		w.WriteByte(opBinInt)
		w.Write(binary.LittleEndian.AppendUint32(nil, uint32(int32(n.Int64()))))
		return
	}
	// Two's complement in the fewest bytes that keep the sign.
	size := n.BitLen()/8 + 1
	v := new(big.Int).Set(n)
	if n.Sign() < 0 {
		v.Add(v, new(big.Int).Lsh(big.NewInt(1), uint(8*size)))
	}
	be := v.FillBytes(make([]byte, size))
	slices.Reverse(be)
	w.Write([]byte{opLong1, byte(size)})
	w.Write(be)
}

// encodeDatetime writes datetime.datetime as Python reduces it: its 10 bytes
// of state, and timezone.utc unless the time was naive.
func encodeDatetime(w *bytes.Buffer, t time.Time) {
	aware := t.Location() != naive
	t = t.UTC()
	us := t.Nanosecond() / 1000
	state := []byte{byte(t.Year() >> 8), byte(t.Year()), byte(t.Month()), byte(t.Day()), byte(t.Hour()),
		byte(t.Minute()), byte(t.Second()), byte(us >> 16), byte(us >> 8), byte(us)}
	encodeGlobal(w, "datetime", "datetime")
	w.Write([]byte{opShortBinBytes, datetimeStateLen})
	w.Write(state)
	if !aware {
		w.Write([]byte{opTuple1, opReduce})
		return
	}
	encodeGlobal(w, "datetime", "timezone")
	encodeGlobal(w, "datetime", "timedelta")
	for range 3 {
		encodeInt(w, big.NewInt(0))
	}
	w.Write([]byte{opTuple3, opReduce, opTuple1, opReduce, opTuple2, opReduce})
}
