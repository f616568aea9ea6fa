package tcpstore

import (
	"testing"

	"github.com/stretchr/testify/require"
)

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

// COMPARE_SET's one implementation, as a client's request reaches it and as Server.CompareSet does: torch's rules,
// except that the in-process writer never creates a key.
func TestCompareSet(t *testing.T) {
	for _, tc := range []struct {
		name              string
		cur               *string // nil: the key is missing
		expected, desired string
		create            bool
		reply, after      string // after: the key's value then; "-" missing
		stored            bool
	}{
		{"missing, expected empty: created", nil, "", "v", true, "v", "v", true},
		{"missing, expected given: torch answers expected", nil, "x", "v", true, "x", "-", false},
		{"missing, in process: never created", nil, "", "v", false, "", "-", false},
		{"equal: stored", ptr("1"), "1", "2", true, "2", "2", true},
		{"equal, in process: stored", ptr("1"), "1", "2", false, "2", "2", true},
		{"differs: the current value", ptr("1"), "0", "2", true, "1", "1", false},
		{"empty value, expected empty: stored", ptr(""), "", "2", false, "2", "2", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _, _ := storeWithConns(t, Quotas{}, 0)
			if tc.cur != nil {
				require.NoError(t, s.set("k", []byte(*tc.cur)))
			}
			reply, stored, err := s.compareSet("k", []byte(tc.expected), []byte(tc.desired), tc.create)
			require.NoError(t, err)
			require.Equal(t, tc.stored, stored)
			require.Equal(t, tc.reply, string(reply))
			after, ok := s.kv["k"]
			if tc.after == "-" {
				require.False(t, ok)
			} else {
				require.Equal(t, tc.after, string(after))
			}
		})
	}
}

func ptr(s string) *string { return &s }

// The in-process COMPARE_SET wakes whoever waits for its key (a BARRIER's counter is such a key) and hands back the
// connections whose STOP_WAITING is to be flushed, as a client's request does; a refused one changes nothing.
func TestCompareSetExisting(t *testing.T) {
	s, cs, do := storeWithConns(t, Quotas{Bytes: ItemCost + 64}, 1)
	cs[0].flushing = false
	require.NoError(t, do(cs[0], &Request{Op: OpBarrier, Key: "b", WorldSize: 2}))
	require.NotNil(t, cs[0].wait)

	stored, kicks, err := s.compareSetExisting("b", []byte("1"), []byte("2"))
	require.NoError(t, err)
	require.True(t, stored)
	require.Equal(t, []*conn{cs[0]}, kicks)
	require.Nil(t, cs[0].wait)
	require.Equal(t, []byte{stopWaiting}, cs[0].tail)

	stored, _, err = s.compareSetExisting("b", []byte("2"), make([]byte, 100))
	var full *StoreFullError
	require.ErrorAs(t, err, &full)
	require.False(t, stored)
	require.Equal(t, "2", string(s.kv["b"]))
}
