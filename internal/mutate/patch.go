package mutate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// Before is what Patch needs to know of a pod before Mutate changes it in
// place: Record it first.
//
// A webhook usually prints the whole mutated pod and diffs it against the
// request's JSON. Mutate only ever adds, so its changes can be described
// directly, at a fraction of the cost (no printing of the whole pod, no
// diff), and without the diff's hazard: fields that this binary's k8s.io/api
// does not know (a newer API server's) are never touched, since no operation
// reaches above what Mutate set. What Mutate changes:
//   - metadata.name, spec.hostname and spec.subdomain, only where empty;
//   - keys of metadata.labels and metadata.annotations, set or removed;
//   - spec.volumes, and each container's env and volumeMounts: appended to;
//   - a container's lifecycle.preStop, only where there is none;
//   - spec.shareProcessNamespace, only where unset;
//   - spec.initContainers: the sidecar in front, an older rdzv-sidecar removed.
//
// Patch returns an error for any other change it sees. TestGolden and
// FuzzMutate check, for every case, that the patch applied to the input's
// JSON gives exactly the JSON of Mutate's result.
type Before struct {
	name, hostname, subdomain string
	shareProcessNamespace     bool // set at all
	labels, annotations       map[string]string
	volumes                   int
	initContainers            []string
	containers                []containerBefore
}

type containerBefore struct {
	name               string
	env, mounts        int
	lifecycle, preStop bool
}

// Record notes what Patch compares Mutate's result with. It copies the
// label and annotation maps, which Mutate changes in place.
func Record(pod *corev1.Pod) *Before {
	b := &Before{
		name: pod.Name, hostname: pod.Spec.Hostname, subdomain: pod.Spec.Subdomain,
		shareProcessNamespace: pod.Spec.ShareProcessNamespace != nil,
		labels:                maps.Clone(pod.Labels), annotations: maps.Clone(pod.Annotations),
		volumes:        len(pod.Spec.Volumes),
		initContainers: make([]string, len(pod.Spec.InitContainers)),
		containers:     make([]containerBefore, len(pod.Spec.Containers)),
	}
	for i := range pod.Spec.InitContainers {
		b.initContainers[i] = pod.Spec.InitContainers[i].Name
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		b.containers[i] = containerBefore{name: c.Name, env: len(c.Env), mounts: len(c.VolumeMounts),
			lifecycle: c.Lifecycle != nil, preStop: c.Lifecycle != nil && c.Lifecycle.PreStop != nil}
	}
	return b
}

// Patch returns the JSON patch (RFC 6902) that turns the pod as Record saw
// it into after, or nil when nothing changed. It applies to the JSON the API
// server sent whatever that holds beside what the typed pod knows.
func (b *Before) Patch(after *corev1.Pod) ([]byte, error) {
	p := &patch{}
	// A serving worker's patch is about 3 KiB: growing the buffer costs
	// more than printing into it.
	p.buf.Grow(4 << 10)
	p.buf.WriteByte('[')
	p.scalar("/metadata/name", b.name, after.Name)
	p.strings("/metadata/labels", b.labels, after.Labels)
	p.strings("/metadata/annotations", b.annotations, after.Annotations)
	p.scalar("/spec/hostname", b.hostname, after.Spec.Hostname)
	p.scalar("/spec/subdomain", b.subdomain, after.Spec.Subdomain)
	switch share := after.Spec.ShareProcessNamespace; {
	case !b.shareProcessNamespace && share != nil:
		p.add("/spec/shareProcessNamespace", *share)
	case b.shareProcessNamespace && share == nil:
		p.fail("spec.shareProcessNamespace was removed")
	}
	appended(p, "/spec/volumes", b.volumes, after.Spec.Volumes)
	if len(after.Spec.Containers) != len(b.containers) {
		p.fail("spec.containers: %d containers, there were %d", len(after.Spec.Containers), len(b.containers))
	}
	for i := range min(len(b.containers), len(after.Spec.Containers)) {
		was, c := b.containers[i], &after.Spec.Containers[i]
		if c.Name != was.name {
			p.fail("spec.containers[%d] is %q, it was %q", i, c.Name, was.name)
		}
		path := "/spec/containers/" + strconv.Itoa(i)
		appended(p, path+"/env", was.env, c.Env)
		appended(p, path+"/volumeMounts", was.mounts, c.VolumeMounts)
		switch {
		case !was.lifecycle && c.Lifecycle != nil:
			p.add(path+"/lifecycle", c.Lifecycle)
		case !was.preStop && c.Lifecycle != nil && c.Lifecycle.PreStop != nil:
			p.add(path+"/lifecycle/preStop", c.Lifecycle.PreStop)
		case was.lifecycle && c.Lifecycle == nil, was.preStop && c.Lifecycle.PreStop == nil:
			p.fail("%s: the lifecycle hook was removed", path)
		}
	}
	p.initContainers(b.initContainers, after.Spec.InitContainers)
	if p.err != nil {
		return nil, fmt.Errorf("mutate: patch: %w", p.err)
	}
	if p.ops == 0 {
		return nil, nil
	}
	p.buf.WriteByte(']')
	return p.buf.Bytes(), nil
}

// patch writes operations as it goes; the first problem is kept in err.
type patch struct {
	buf bytes.Buffer
	enc *json.Encoder
	ops int
	err error
}

func (p *patch) fail(format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf(format, args...)
	}
}

func (p *patch) op(op, path string) {
	if p.ops > 0 {
		p.buf.WriteByte(',')
	}
	p.ops++
	p.buf.WriteString(`{"op":"`)
	p.buf.WriteString(op)
	p.buf.WriteString(`","path":`)
	// Paths are ours, but map keys in them come from the pod: only plain ones
	// are printed as they are.
	if plain(path) {
		p.buf.WriteByte('"')
		p.buf.WriteString(path)
		p.buf.WriteByte('"')
	} else {
		p.value(path)
	}
}

// plain tells whether json.Marshal prints s between quotes as it is.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// value prints v as json.Marshal does.
func (p *patch) value(v any) {
	if p.enc == nil {
		p.enc = json.NewEncoder(&p.buf)
	}
	if err := p.enc.Encode(v); err != nil {
		p.fail("encode %T: %w", v, err)
		return
	}
	p.buf.Truncate(p.buf.Len() - 1) // the newline
}

func (p *patch) add(path string, v any) {
	p.op("add", path)
	p.buf.WriteString(`,"value":`)
	p.value(v)
	p.buf.WriteByte('}')
}

func (p *patch) remove(path string) {
	p.op("remove", path)
	p.buf.WriteByte('}')
}

// scalar: the string fields Mutate sets are omitempty, absent from the JSON
// while empty; "add" sets an object member whether it is there or not.
func (p *patch) scalar(path, was, is string) {
	switch {
	case was == is:
	case is == "":
		p.fail("%s was removed", path)
	default:
		p.add(path, is)
	}
}

// strings patches a map of strings key by key (in key order, so the patch is
// the same every time), or whole where it was empty, and so absent.
func (p *patch) strings(path string, was, is map[string]string) {
	switch {
	case len(was) == 0 && len(is) == 0:
		return
	case len(was) == 0:
		p.add(path, is)
		return
	case len(is) == 0:
		p.remove(path)
		return
	}
	var keys []string
	for k, v := range is {
		if old, ok := was[k]; !ok || old != v {
			keys = append(keys, k)
		}
	}
	for k := range was {
		if _, ok := is[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		if v, ok := is[k]; ok {
			p.add(path+"/"+escape(k), v)
		} else {
			p.remove(path + "/" + escape(k))
		}
	}
}

// appended patches a list Mutate appended to: whole where it was empty (and
// so absent), element by element at its end otherwise.
func appended[T any](p *patch, path string, was int, is []T) {
	switch {
	case len(is) < was:
		p.fail("%s: %d elements, there were %d", path, len(is), was)
	case len(is) == was:
	case was == 0:
		p.add(path, is)
	default:
		for i := was; i < len(is); i++ {
			p.add(path+"/-", &is[i])
		}
	}
}

// initContainers: Mutate puts the sidecar in front of the pod's own init
// containers and drops an older container of the sidecar's name from them.
func (p *patch) initContainers(was []string, is []corev1.Container) {
	if len(is) == len(was) && slices.EqualFunc(was, is, func(n string, c corev1.Container) bool { return n == c.Name }) {
		return // unchanged (a pod Mutate had already mutated)
	}
	const path = "/spec/initContainers"
	kept := slices.DeleteFunc(slices.Clone(was), func(n string) bool { return n == constants.SidecarContainerName })
	if len(is) != len(kept)+1 || is[0].Name != constants.SidecarContainerName ||
		!slices.EqualFunc(kept, is[1:], func(n string, c corev1.Container) bool { return n == c.Name }) {
		names := make([]string, len(is))
		for i := range is {
			names[i] = is[i].Name
		}
		p.fail("%s: [%s] is not the sidecar in front of [%s]", path, strings.Join(names, " "), strings.Join(was, " "))
		return
	}
	if len(was) == 0 {
		p.add(path, is)
		return
	}
	// From the end, so that every index still means what it did.
	for i := len(was) - 1; i >= 0; i-- {
		if was[i] == constants.SidecarContainerName {
			p.remove(path + "/" + strconv.Itoa(i))
		}
	}
	p.add(path+"/0", &is[0])
}

// escape makes a map key one JSON pointer token (RFC 6901).
func escape(key string) string {
	if !strings.ContainsAny(key, "~/") {
		return key
	}
	return pointerEscaper.Replace(key)
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")
