package mutate

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestKeepAliveInterval(t *testing.T) {
	for _, c := range []struct{ configured, maxNodes, want int }{
		{2, 1, 2},
		{2, 64, 2},
		{2, 65, 3},
		{2, 256, 8},
		{2, 1024, 32},
		{2, 100000, 3125},
		{60, 1024, 60}, // a longer configured interval is kept
	} {
		t.Run(fmt.Sprintf("%d/%d", c.configured, c.maxNodes), func(t *testing.T) {
			got := KeepAliveInterval(c.configured, c.maxNodes)
			assert.Equal(t, c.want, got)
			assert.LessOrEqual(t, float64(c.maxNodes)/float64(got), float64(maxHeartbeatsPerSecond), "heartbeats a second")
		})
	}
}

func TestMonitorInterval(t *testing.T) {
	for _, c := range []struct {
		configured float64
		maxNodes   int
		want       float64
	}{
		{0.1, 1, 0.1},
		{0.1, 409, 0.1},
		{0.1, 410, 0.11},
		{0.1, 1024, 0.25},
		{0.1, 4096, 1},
		{0.1, 16384, 4},
		{2, 1024, 2}, // a longer configured interval is kept
	} {
		t.Run(fmt.Sprintf("%v/%d", c.configured, c.maxNodes), func(t *testing.T) {
			got := MonitorInterval(c.configured, c.maxNodes)
			assert.InDelta(t, c.want, got, 1e-9)
			assert.LessOrEqual(t, float64(c.maxNodes)/got, float64(maxWaitingChecksPerSecond), "checks a second")
		})
	}
}

func TestDefaultMonitorIntervalValidated(t *testing.T) {
	for _, c := range []struct {
		interval float64
		ok       bool
	}{{0.1, true}, {1, true}, {3600, true}, {0.05, false}, {0, false}, {math.NaN(), false}, {3601, false}} {
		cfg := DefaultConfig()
		cfg.SidecarImage = "rdzv-sidecar:test"
		cfg.Defaults.MonitorInterval = c.interval
		err := cfg.Validate()
		if c.ok {
			assert.NoError(t, err, "%v", c.interval)
		} else {
			assert.ErrorContains(t, err, "--default-monitor-interval", "%v", c.interval)
		}
	}
}

// A --pod-replacement-url that no serving sidecar could ask at (podreplace.CheckURL) fails the webhook's start.
func TestPodReplacementURLValidated(t *testing.T) {
	for url, ok := range map[string]bool{
		"": true, // off
		"https://wh.elastic-training.svc:443/replace-pod": true,
		"http://wh.elastic-training.svc/replace-pod":      false,
		"https://user@wh/replace-pod":                     false,
	} {
		cfg := DefaultConfig()
		cfg.SidecarImage = "rdzv-sidecar:test"
		cfg.PodReplacement.URL = url
		err := cfg.Validate()
		if ok {
			assert.NoError(t, err, url)
		} else {
			assert.ErrorContains(t, err, "--pod-replacement-url=", url)
		}
	}
}
