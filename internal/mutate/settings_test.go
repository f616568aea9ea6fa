package mutate

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzNameChecks: the hand-written name checks accept exactly the strings
// that k8s.io/apimachinery's validation functions and the run id's regular
// expression accept.
func FuzzNameChecks(f *testing.F) {
	for _, s := range []string{"", "a", "0", "-", "a-", "-a", "a-b", "a--b", "job-1", "1job", "Job", "a.b", "a..b", ".a", "a.",
		"a.-b", "ab.c0", "my-run.2024_01", "_x", "x_", "a\n", "é", "a b", "ab\x00",
		strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 128), strings.Repeat("a", 129),
		strings.Repeat("a", 100) + "." + strings.Repeat("b", 100), strings.Repeat("a.", 126) + "a", strings.Repeat("a.", 127) + "a"} {
		f.Add(s)
	}
	runID := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	f.Fuzz(func(t *testing.T, s string) {
		assert.Equal(t, len(validation.IsDNS1035Label(s)) == 0, isDNS1035Label(s), "DNS-1035 label %q", s)
		assert.Equal(t, len(validation.IsDNS1123Label(s)) == 0, isDNS1123Label(s), "DNS-1123 label %q", s)
		assert.Equal(t, len(validation.IsDNS1123Subdomain(s)) == 0, isDNS1123Subdomain(s), "DNS-1123 subdomain %q", s)
		assert.Equal(t, runID.MatchString(s), isRunID(s), "run id %q", s)
	})
}
