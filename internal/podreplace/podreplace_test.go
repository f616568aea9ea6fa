package podreplace

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		body, err string
		want      Request
	}{
		{body: `{"pod":"j-worker-1-abcde","reason":"2 hangs"}`, want: Request{Pod: "j-worker-1-abcde", Reason: "2 hangs"}},
		{body: `{"pod":"p"}`, want: Request{Pod: "p"}},
		{body: `{"pod":"p","reason":"rank 3 frozen, näher am Ende"}`, want: Request{Pod: "p", Reason: "rank 3 frozen, näher am Ende"}},
		{body: `{"pod":"` + strings.Repeat("a", 253) + `"}`, want: Request{Pod: strings.Repeat("a", 253)}},
		{body: `{"pod":"` + strings.Repeat("a", 254) + `"}`, err: "no more than 253 characters"},
		{body: `{"pod":"../etc"}`, err: `pod "../etc"`},
		{body: `{"pod":"p","reason":"two\nlines"}`, err: "not printable at byte 3"},
		{body: `{"pod":"p","reason":"\ud800"}`, want: Request{Pod: "p", Reason: "\ufffd"}},
		{body: `null`, err: "pod: empty"},
		{body: ``, err: "want a JSON object"},
		{body: `{"pod":1}`, err: "want a JSON object"},
		{body: `{"pod":""}`, err: "pod: empty"},
		{body: `{}`, err: "pod: empty"},
		{body: `{"pod":"Not_A_Name"}`, err: `pod "Not_A_Name": a lowercase RFC 1123 subdomain`},
		{body: `{"pod":"p","node":"n"}`, err: `unknown field "node"`},
		{body: `{"pod":"p"} {"pod":"q"}`, err: "more than one JSON value"},
		{body: `[1]`, err: "want a JSON object"},
		{body: `{"pod":"p","reason":"a\u0000b"}`, err: "not printable at byte 1"},
		{body: `{"pod":"p","reason":"` + strings.Repeat("x", MaxReasonBytes+1) + `"}`, err: "reason of 1025 bytes"},
		{body: strings.Repeat(" ", MaxRequestBytes+1), err: "more than 4096"},
	} {
		got, err := ParseRequest([]byte(tc.body))
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.body)
			continue
		}
		require.NoError(t, err, tc.body)
		require.Equal(t, tc.want, got)
	}
}

// A request that parses is one the server can act on: a valid pod name, a bounded printable reason; and nothing
// panics.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{`{"pod":"j-worker-1-abcde","reason":"2 hangs"}`, `{"pod":""}`, `{"pod":"p"} x`, `{"reason":"\u00e9"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			return
		}
		if r.Pod == "" || len(r.Pod) > 253 || len(r.Reason) > MaxReasonBytes || strings.ContainsAny(r.Pod, "/ _") {
			t.Fatalf("accepted %q as %+v", b, r)
		}
	})
}
