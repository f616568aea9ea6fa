package mutate

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	kjson "sigs.k8s.io/json"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/membudget"
)

// The injected sidecar's resources: the webhook's defaults per mode, a job's own (AnnotationSidecarResources), and
// the shape that keeps a Guaranteed trainer's pod Guaranteed.

// sidecarResourcesWant is what a denial of AnnotationSidecarResources asks for.
var sidecarResourcesWant = fmt.Sprintf(`JSON {"serve": {"requests": {...}, "limits": {...}}, "join": {...}} (each key optional) of %s, at most %d bytes`,
	strings.Join(constants.SidecarResourceNames, ", "), constants.MaxSidecarResourcesBytes)

// parseSidecarResources reads AnnotationSidecarResources over def. A mode the value names replaces def's mode whole:
// what it leaves out the sidecar does not get, so that the value alone says what the sidecar gets, and a request
// raised above a default limit is never left under that limit. A mode it leaves out (or gives as null) keeps def's.
func parseSidecarResources(v string, def SidecarResources) (SidecarResources, error) {
	if len(v) > constants.MaxSidecarResourcesBytes {
		return def, fmt.Errorf("the value has %d bytes", len(v))
	}
	modes, err := object("the value", json.RawMessage(v), []string{modeServe, modeJoin})
	if err != nil {
		return def, err
	}
	out := def
	for _, m := range []struct {
		mode string
		res  *corev1.ResourceRequirements
	}{{modeServe, &out.Serve}, {modeJoin, &out.Join}} {
		lists, err := object(m.mode, modes[m.mode], []string{"requests", "limits"})
		if err != nil {
			return def, err
		}
		if lists == nil {
			continue
		}
		if *m.res, err = modeResources(m.mode, lists); err != nil {
			return def, err
		}
	}
	return out, nil
}

// object decodes raw (what names it in errors) as a JSON object whose keys are among allowed (nil: any), keeping its
// values raw, so that each problem is named by where it is; null is no object (nil). Keys are case-sensitive, as
// the API server reads a pod's resources, and a key given twice is refused (one of the two would be lost).
func object(what string, raw json.RawMessage, allowed []string) (map[string]json.RawMessage, error) {
	if raw == nil {
		return nil, nil
	}
	var m map[string]json.RawMessage
	strict, err := kjson.UnmarshalStrict(raw, &m, kjson.DisallowDuplicateFields)
	switch {
	case err != nil && what == "the value":
		return nil, fmt.Errorf("not a JSON object: %s", truncate(err.Error(), 100))
	case err != nil:
		return nil, fmt.Errorf("%s: %s is not a JSON object", what, truncate(string(raw), 32))
	case len(strict) > 0:
		return nil, fmt.Errorf("%s: %s", what, truncate(strict[0].Error(), 100))
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if allowed != nil && !slices.Contains(allowed, k) {
			return nil, fmt.Errorf("%s: key %q is not one of %s", what, truncate(k, 32), strings.Join(allowed, ", "))
		}
	}
	return m, nil
}

// modeResources checks one mode's requests and limits and returns them as a container's.
func modeResources(mode string, lists map[string]json.RawMessage) (corev1.ResourceRequirements, error) {
	var r corev1.ResourceRequirements
	var err error
	if r.Requests, err = resourceList(mode+".requests", lists["requests"]); err != nil {
		return r, err
	}
	if r.Limits, err = resourceList(mode+".limits", lists["limits"]); err != nil {
		return r, err
	}
	// The API server would refuse the pod for it, after admission, where only the Job's events tell.
	for _, name := range constants.SidecarResourceNames {
		req, hasReq := r.Requests[corev1.ResourceName(name)]
		lim, hasLim := r.Limits[corev1.ResourceName(name)]
		if hasReq && hasLim && lim.Cmp(req) < 0 {
			return r, fmt.Errorf("%s: limits.%s=%s is below requests.%s=%s: want a limit at least its request",
				mode, name, lim.String(), name, req.String())
		}
	}
	return r, nil
}

// resourceList parses one list of quantities (what names it in errors), in the order of their names so that the
// same value always gets the same denial. An empty list is none.
func resourceList(what string, raw json.RawMessage) (corev1.ResourceList, error) {
	m, err := object(what, raw, nil)
	if err != nil || len(m) == 0 {
		return nil, err
	}
	out := make(corev1.ResourceList, len(m))
	for _, name := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(constants.SidecarResourceNames, name) {
			return nil, fmt.Errorf("%s: %q is not a resource the sidecar may set: want one of %s",
				what, truncate(name, 32), strings.Join(constants.SidecarResourceNames, ", "))
		}
		q, err := parseQuantity(m[name])
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", what, name, err)
		}
		out[corev1.ResourceName(name)] = q
	}
	return out, nil
}

// parseQuantity reads a quantity as Kubernetes writes one in JSON: a string ("500m", "1Gi") or a number.
func parseQuantity(raw json.RawMessage) (resource.Quantity, error) {
	text := string(raw)
	if strings.HasPrefix(text, `"`) {
		if err := json.Unmarshal(raw, &text); err != nil {
			return resource.Quantity{}, err
		}
	}
	q, err := resource.ParseQuantity(text)
	if err != nil {
		return q, fmt.Errorf("%q is not a quantity: want e.g. 100m, 2, 256Mi", truncate(text, 32))
	}
	if q.Sign() < 0 {
		return q, fmt.Errorf("%s is negative: want a quantity >= 0", q.String())
	}
	return q, nil
}

// The resources the kubelet's QoS class looks at (ephemeral-storage and extended resources do not count).
var qosResources = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}

// guaranteedShaped says whether r would make its container count for a Guaranteed pod: cpu and memory limits, and
// requests equal to them. A request left out counts as its limit, since the API server defaults it so. Kubernetes
// ignores zero quantities here, and so does this.
func guaranteedShaped(r corev1.ResourceRequirements) bool {
	for _, name := range qosResources {
		lim, ok := r.Limits[name]
		if !ok || lim.Sign() <= 0 {
			return false
		}
		if req, ok := r.Requests[name]; ok && req.Cmp(lim) != 0 {
			return false
		}
	}
	return true
}

// missingQoSResources names the resources of qosResources that r neither requests nor limits (zero counts as
// neither, as for guaranteedShaped).
func missingQoSResources(r corev1.ResourceRequirements) []string {
	var missing []string
	for _, name := range qosResources {
		req, lim := r.Requests[name], r.Limits[name]
		if req.Sign() <= 0 && lim.Sign() <= 0 {
			missing = append(missing, string(name))
		}
	}
	return missing
}

// guaranteedResources is r made Guaranteed-shaped: for cpu and memory each, the request and the limit both become
// the larger of the two (one left out counts as the other), so that the sidecar never gets less than it would have.
// A resource r has neither of is left out: there is nothing to take (Mutate warns).
func guaranteedResources(r corev1.ResourceRequirements) corev1.ResourceRequirements {
	out := *r.DeepCopy()
	for _, name := range qosResources {
		req, hasReq := r.Requests[name]
		lim, hasLim := r.Limits[name]
		switch {
		case !hasReq && !hasLim:
			continue
		case !hasReq:
			req = lim
		case !hasLim:
			lim = req
		}
		q := req
		if lim.Cmp(req) > 0 {
			q = lim
		}
		if out.Requests == nil {
			out.Requests = corev1.ResourceList{}
		}
		if out.Limits == nil {
			out.Limits = corev1.ResourceList{}
		}
		out.Requests[name], out.Limits[name] = q.DeepCopy(), q.DeepCopy()
	}
	return out
}

// sidecarResources is the sidecar's resources in mode, a copy of its own: the job's (AnnotationSidecarResources),
// else the webhook's default, made Guaranteed-shaped beside a Guaranteed-shaped trainer. Kubernetes makes a pod
// Guaranteed only when every container is, the native sidecar included; without it the kubelet's static CPU manager
// gives the trainer no exclusive CPUs and the single-numa-node topology manager does not align it.
func (s *settings) sidecarResources(mode string) corev1.ResourceRequirements {
	r := s.sidecarRes.Join
	if mode == modeServe {
		r = s.sidecarRes.Serve
	}
	r = *r.DeepCopy()
	if s.checkpointBytes > 0 {
		// The copies of other pods' checkpoints that the sidecar writes into the memory-backed volume are charged to
		// its memory: its limit grows by what the volume may hold, or its first copies would get it OOM-killed.
		if l, ok := r.Limits[corev1.ResourceMemory]; ok {
			l.Add(*resource.NewQuantity(s.checkpointBytes, resource.BinarySI))
			r.Limits[corev1.ResourceMemory] = l
		}
	}
	if l, ok := r.Limits[corev1.ResourceMemory]; ok && mode == modeServe {
		// The serving sidecar's quotas are shares of its limit (internal/membudget): it grows to what carries the
		// job's largest size, its connections and its own state, or a job of thousands of nodes would be refused
		// connections by its own rendezvous.
		legacy := s.backend == constants.BackendEtcd || s.backend == constants.BackendEtcdV2
		if need := membudget.LimitFor(l.Value(), s.checkpointBytes, legacy, s.maxNodes); need > l.Value() {
			r.Limits[corev1.ResourceMemory] = *resource.NewQuantity(need, resource.BinarySI)
		}
	}
	if s.guaranteed {
		return guaranteedResources(r)
	}
	return r
}
