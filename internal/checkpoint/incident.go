package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Incident is a checkpoint that did not fit in a pod's checkpoint.memory: a trainer's save (refused, on every
// rank, with a CheckpointError) or its sidecar's copy of another pod's piece (left where it is). The pod's holder
// writes it into the job's store; the serving sidecar makes it a Warning Event on the Job, so that a user sees it
// without reading every pod's log.
type Incident struct {
	Kind   string `json:"kind"` // IncidentSave or IncidentCopy
	Host   string `json:"host"` // the pod, by its member host; set by its holder
	Step   int64  `json:"step"`
	Rank   int    `json:"rank"`   // the save's rank (a copy: the piece's)
	Need   int64  `json:"need"`   // bytes the save or copy needs
	Free   int64  `json:"free"`   // bytes free in the pod's checkpoint directory (a copy: beyond the room kept for the next save)
	Memory int64  `json:"memory"` // the pod's checkpoint.memory, bytes; set by its holder
}

// Kinds of Incident.
const (
	IncidentSave = "save"
	IncidentCopy = "copy"
)

// maxIncident bounds an incident's JSON: a trainer's request and a value read from the store alike.
const maxIncident = 1 << 10

// ParseIncident reads an incident strictly: one JSON object of at most 1 KiB, no unknown fields, a known kind,
// figures in range, and a host (when set) that is a DNS name.
func ParseIncident(data []byte) (Incident, error) {
	if len(data) > maxIncident {
		return Incident{}, fmt.Errorf("incident: %d bytes, at most %d", len(data), maxIncident)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var in Incident
	if err := dec.Decode(&in); err != nil {
		return Incident{}, fmt.Errorf("incident: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Incident{}, errors.New("incident: more than one JSON value")
	}
	switch {
	case in.Kind != IncidentSave && in.Kind != IncidentCopy:
		return Incident{}, fmt.Errorf("incident: kind %.20q, want %q or %q", in.Kind, IncidentSave, IncidentCopy)
	case in.Step < 0 || in.Rank < 0 || in.Rank >= MaxWorld:
		return Incident{}, fmt.Errorf("incident: step %d rank %d out of range", in.Step, in.Rank)
	case in.Need <= 0 || in.Free < 0 || in.Memory < 0:
		return Incident{}, fmt.Errorf("incident: need %d, free %d, memory %d bytes", in.Need, in.Free, in.Memory)
	case in.Host != "" && len(validation.IsDNS1123Subdomain(in.Host)) > 0:
		return Incident{}, fmt.Errorf("incident: host %.80q is not a DNS name", in.Host)
	}
	return in, nil
}

// Message is the incident as a user reads it in `kubectl describe job`: what did not fit, the figures, and what
// to change.
func (in Incident) Message() string {
	of := ""
	if in.Memory > 0 {
		of = " of " + bytesOf(in.Memory)
	}
	if in.Kind == IncidentCopy {
		return fmt.Sprintf("Pod %s has no room for a copy of rank %d's checkpoint of step %d: it needs %s, %s%s of checkpoint.memory is free beyond its own next save. That piece has fewer copies than checkpoint.replicas: raise checkpoint.memory (about 2 x (1 + replicas) x a pod's state).",
			in.Host, in.Rank, in.Step, bytesOf(in.Need), bytesOf(in.Free), of)
	}
	return fmt.Sprintf("Rank %d (pod %s) could not save step %d in memory: it needs %s, %s%s of checkpoint.memory is free. Every rank's save raised CheckpointError: raise checkpoint.memory (about 2 x (1 + replicas) x a pod's state) or save less.",
		in.Rank, in.Host, in.Step, bytesOf(in.Need), bytesOf(in.Free), of)
}

// bytesOf is a byte count as a quantity a user writes in checkpoint.memory (1536Mi, 2Gi).
func bytesOf(n int64) string {
	if n >= 1<<20 {
		return resource.NewQuantity(n/(1<<20)*(1<<20), resource.BinarySI).String()
	}
	return fmt.Sprintf("%d bytes", n)
}
