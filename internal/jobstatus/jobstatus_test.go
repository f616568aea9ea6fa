package jobstatus

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAnnotations(t *testing.T) {
	at := time.Date(2026, 12, 6, 23, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		s    Status
		want map[string]string
	}{
		{"training, of a known total", Status{Phase: Training, World: 3, Round: 4, Step: 1200, Total: 5000, StepTime: 250 * time.Millisecond, Incident: "22:58:00Z round 4: world 2 -> 3"},
			map[string]string{Phase: "Training", World: "3", Round: "4", Step: "1200/5000", Rate: "4.00", ETA: "15m50s", Incident: "22:58:00Z round 4: world 2 -> 3", Updated: "2026-12-06T23:00:00Z"}},
		{"no progress said", Status{Phase: Running, World: 2, Round: 1},
			map[string]string{Phase: "Running", World: "2", Round: "1", Step: "-", Rate: "-", ETA: "-", Incident: "-", Updated: "2026-12-06T23:00:00Z"}},
		{"a total unknown: no ETA", Status{Phase: Training, World: 2, Round: 1, Step: 7, StepTime: time.Second},
			map[string]string{Phase: "Training", World: "2", Round: "1", Step: "7", Rate: "1.00", ETA: "-", Incident: "-", Updated: "2026-12-06T23:00:00Z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Annotations(tc.s, at)
			assert.Equal(t, tc.want, got)
			require.Len(t, Keys, len(got), "every annotation is a column")
		})
	}
}

func TestChanged(t *testing.T) {
	s := Status{Phase: Training, World: 2, Round: 1, Step: 5}
	a, b := Annotations(s, time.Unix(0, 0)), Annotations(s, time.Unix(60, 0))
	require.False(t, Changed(a, b), "only the time differs")
	s.Step = 6
	require.True(t, Changed(a, Annotations(s, time.Unix(60, 0))))
	assert.JSONEq(t, `{"metadata":{"annotations":{"a":"1"}}}`, string(MergePatch(map[string]string{"a": "1"})))
}
