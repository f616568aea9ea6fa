package mutate

import (
	"fmt"
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
