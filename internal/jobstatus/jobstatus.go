// Package jobstatus is a training job's status as kubectl shows it without a CRD: annotations on the job's Job,
// which the serving sidecar keeps current (docs/hangs.md "Status"): its phase, world size, round, step of total,
// steps per second, ETA and last incident. Pure: a status in, annotations and the merge patch that writes the
// changed ones out.
package jobstatus

import (
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// The annotations, one per column of the status command (NOTES.txt prints it).
const (
	Phase    = constants.Domain + "/phase"
	World    = constants.Domain + "/world-size"
	Round    = constants.Domain + "/round"
	Step     = constants.Domain + "/step"
	Rate     = constants.Domain + "/steps-per-second"
	ETA      = constants.Domain + "/eta"
	Incident = constants.Domain + "/last-incident"
	Updated  = constants.Domain + "/status-updated"
)

// Keys are the annotations in column order.
var Keys = []string{Phase, World, Round, Step, Rate, ETA, Incident, Updated}

// Phases.
const (
	Forming  = "Forming"  // a round is forming: a scale, a loss, a restart
	Running  = "Running"  // a round holds; its ranks said no progress yet (or never do)
	Training = "Training" // a round holds and its ranks advance
	Hung     = "Hung"     // the round was found hung and restarts
	Closed   = "Closed"   // the rendezvous is closed: the job ends
)

// Status is what the annotations say.
type Status struct {
	Phase       string
	World       int
	Round       int
	Step, Total int64         // 0: none reported (Total 0: unknown)
	StepTime    time.Duration // 0: unknown
	Incident    string        // the last one, with its time
}

// Annotations are s's values; at, the time it was taken (RFC 3339, seconds), is not compared (Changed).
func Annotations(s Status, at time.Time) map[string]string {
	a := map[string]string{Phase: s.Phase, World: strconv.Itoa(s.World), Round: strconv.Itoa(s.Round),
		Step: "-", Rate: "-", ETA: "-", Incident: "-", Updated: at.UTC().Format(time.RFC3339)}
	if s.Step > 0 {
		a[Step] = strconv.FormatInt(s.Step, 10)
		if s.Total > 0 {
			a[Step] += "/" + strconv.FormatInt(s.Total, 10)
		}
	}
	if s.StepTime > 0 {
		a[Rate] = strconv.FormatFloat(float64(time.Second)/float64(s.StepTime), 'f', 2, 64)
		if s.Total > s.Step {
			a[ETA] = (time.Duration(s.Total-s.Step) * s.StepTime).Round(time.Second).String()
		}
	}
	if s.Incident != "" {
		a[Incident] = s.Incident
	}
	return a
}

// Changed says whether next differs from prev in anything but the time it was taken.
func Changed(prev, next map[string]string) bool {
	eq := func(a, b string) bool { return a == b }
	p, n := maps.Clone(prev), maps.Clone(next)
	delete(p, Updated)
	delete(n, Updated)
	return !maps.EqualFunc(p, n, eq)
}

// MergePatch is the JSON merge patch that sets the annotations a.
func MergePatch(a map[string]string) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": a}})
	return b
}

// IncidentAt is an incident's text with the time it happened.
func IncidentAt(what string, at time.Time) string {
	return fmt.Sprintf("%s %s", at.UTC().Format("15:04:05Z"), what)
}
