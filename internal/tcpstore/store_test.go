package tcpstore

import "testing"

func TestParseInt(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "42": 42, "-7": -7, "+5": 5, "  12": 12, "\n\t\v\f\r3": 3, "12abc": 12, "3\x009": 3, "0x10": 0,
		"9223372036854775807": 1<<63 - 1, "-9223372036854775808": -1 << 63, "007": 7,
	} {
		if got, err := parseInt([]byte(in)); err != nil || got != want {
			t.Errorf("parseInt(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "abc", "-", "+", " ", "9223372036854775808", "-9223372036854775809", "99999999999999999999999"} {
		if got, err := parseInt([]byte(in)); err == nil {
			t.Errorf("parseInt(%q) = %d, want an error", in, got)
		}
	}
}
