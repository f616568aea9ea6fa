package testenv

import (
	"cmp"
	"slices"
)

// Median is the middle of v (which it leaves as it is); of an even count,
// the upper of the two middle values, so that the median of measurements is
// one that was measured. It panics on an empty v.
func Median[T cmp.Ordered](v []T) T {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
