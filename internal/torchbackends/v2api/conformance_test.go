package v2api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// step is one raw v2 request, the way python-etcd sends it: GET and DELETE
// parameters in the query string, PUT and POST parameters as a form body.
// Parameter values may use {idx+1} (the X-Etcd-Index of the previous response
// plus one) and {mod:NAME} (the modifiedIndex returned by step NAME), so the
// same script runs against servers whose index numbers differ.
type step struct {
	name   string
	method string
	key    string
	params map[string]string
	during []step // for wait=true: run these while the wait is open
}

// result is what must be equal on both servers.
type result struct {
	Step   string
	Status int
	Body   any
	// Headers python-etcd reads.
	HasEtcdIndex, HasClusterID bool
}

type runner struct {
	t       *testing.T
	base    string
	lastIdx uint64
	mods    map[string]uint64
}

var tmplRe = regexp.MustCompile(`\{(idx\+1|mod:[a-z0-9-]+)\}`)

func (r *runner) expand(v string) string {
	return tmplRe.ReplaceAllStringFunc(v, func(m string) string {
		m = m[1 : len(m)-1]
		if m == "idx+1" {
			return strconv.FormatUint(r.lastIdx+1, 10)
		}
		return strconv.FormatUint(r.mods[strings.TrimPrefix(m, "mod:")], 10)
	})
}

func (r *runner) send(s step) *http.Response {
	vals := url.Values{}
	for k, v := range s.params {
		vals.Set(k, r.expand(v))
	}
	u := r.base + "/v2/keys" + s.key
	var body io.Reader
	if s.method == http.MethodPut || s.method == http.MethodPost {
		body = strings.NewReader(vals.Encode())
	} else if len(vals) > 0 {
		u += "?" + vals.Encode()
	}
	req, err := http.NewRequest(s.method, u, body)
	require.NoError(r.t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(r.t, err, "step %s", s.name)
	return resp
}

func (r *runner) finish(s step, resp *http.Response) result {
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(r.t, err)
	res := result{Step: s.name, Status: resp.StatusCode,
		HasEtcdIndex: resp.Header.Get("X-Etcd-Index") != "",
		HasClusterID: resp.Header.Get("X-Etcd-Cluster-Id") != ""}
	if i, err := strconv.ParseUint(resp.Header.Get("X-Etcd-Index"), 10, 64); err == nil {
		r.lastIdx = i
	}
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		res.Body = strings.TrimSpace(string(raw))
		return res
	}
	if n, ok := body["node"].(map[string]any); ok {
		if m, ok := n["modifiedIndex"].(float64); ok {
			r.mods[s.name] = uint64(m)
		}
	}
	res.Body = normalize(body, "")
	return res
}

func (r *runner) run(steps []step) []result {
	var out []result
	for _, s := range steps {
		if len(s.during) == 0 {
			out = append(out, r.finish(s, r.send(s)))
			continue
		}
		ch := make(chan *http.Response, 1)
		go func() { ch <- r.send(s) }()
		saved := r.lastIdx
		var inner []result
		for _, d := range s.during {
			inner = append(inner, r.finish(d, r.send(d)))
		}
		r.lastIdx = saved
		select {
		case resp := <-ch:
			out = append(out, r.finish(s, resp))
		case <-time.After(10 * time.Second):
			r.t.Fatalf("wait step %s got no event", s.name)
		}
		out = append(out, inner...)
	}
	return out
}

var seqRe = regexp.MustCompile(`/\d{20}`)
var digitsRe = regexp.MustCompile(`\d+`)

// normalize removes what legitimately differs between two servers: index
// numbers, absolute expiration times, in-order key numbers and the exact
// remaining TTL (which depends on timing).
func normalize(v any, field string) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			switch k {
			case "modifiedIndex", "createdIndex", "index":
				out[k] = "N"
			case "expiration":
				out[k] = "T"
			case "ttl":
				out[k] = "ttl>0"
			default:
				out[k] = normalize(e, k)
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e, field)
		}
		return out
	case string:
		switch field {
		case "key":
			return seqRe.ReplaceAllString(x, "/SEQ")
		case "cause":
			return digitsRe.ReplaceAllString(seqRe.ReplaceAllString(x, "/SEQ"), "N")
		}
		return x
	}
	return v
}

func p(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// torchScript covers every operation torch's etcd and etcd-v2 rendezvous
// backends send (FACTS section 1) and their error paths.
var torchScript = []step{
	{name: "get-missing", method: "GET", key: "/torchelastic/p2p"},
	{name: "mkdir-prefix", method: "PUT", key: "/torchelastic/p2p", params: p("dir", "true", "prevExist", "false")},
	{name: "mkdir-prefix-again", method: "PUT", key: "/torchelastic/p2p", params: p("dir", "true", "prevExist", "false")},
	{name: "mkdir-run-ttl", method: "PUT", key: "/torchelastic/p2p/run_1", params: p("dir", "true", "prevExist", "false", "ttl", "7200")},
	{name: "get-run", method: "GET", key: "/torchelastic/p2p/run_1"},
	// etcd 3.4 accepts a directory refresh; 3.5's and 3.7's v2store refuse it
	// (etcd-io/etcd#13589). The sidecar behaves as 3.4 (see dirttl.go).
	{name: "refresh-run-dir", method: "PUT", key: "/torchelastic/p2p/run_1", params: p("refresh", "true", "prevExist", "true", "ttl", "7200")},
	{name: "refresh-missing-dir", method: "PUT", key: "/torchelastic/p2p/run_9", params: p("refresh", "true", "prevExist", "true", "ttl", "7200")},
	{name: "mkdir-rdzv", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv", params: p("dir", "true", "prevExist", "false")},
	{name: "create-counter", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/version_counter", params: p("value", "0", "prevExist", "false")},
	{name: "create-counter-again", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/version_counter", params: p("value", "0", "prevExist", "false")},
	{name: "create-active-ttl", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/active_version", params: p("value", `{"status": "setup"}`, "prevExist", "false", "ttl", "5")},
	{name: "get-counter", method: "GET", key: "/torchelastic/p2p/run_1/rdzv/version_counter"},
	{name: "cas-counter-index", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/version_counter", params: p("value", "1", "prevIndex", "{mod:create-counter}")},
	{name: "cas-counter-stale-index", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/version_counter", params: p("value", "2", "prevIndex", "{mod:create-counter}")},
	{name: "mkdir-v1", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/v_1", params: p("dir", "true", "prevExist", "false")},
	{name: "cas-active-value", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/active_version", params: p("value", `{"status": "joinable", "version": "1", "participants": []}`, "prevValue", `{"status": "setup"}`)},
	{name: "cas-active-wrong-value", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/active_version", params: p("value", "x", "prevValue", `{"status": "setup"}`)},
	{name: "cas-missing", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/nope", params: p("value", "x", "prevValue", "y")},
	{name: "refresh-key", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/active_version", params: p("refresh", "true", "prevExist", "true", "ttl", "10")},
	{name: "refresh-missing", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/gone", params: p("refresh", "true", "prevExist", "true", "ttl", "10")},
	{name: "refresh-no-ttl", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/active_version", params: p("refresh", "true", "prevExist", "true")},
	{name: "refresh-with-value", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/active_version", params: p("refresh", "true", "ttl", "5", "value", "v")},
	{name: "set-rank-keepalive", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/v_1/rank_0", params: p("ttl", "10")},
	{name: "create-extra", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/v_1/extra_data", params: p("value", `{"a": 1}`, "prevExist", "false")},
	{name: "list-v1", method: "GET", key: "/torchelastic/p2p/run_1/rdzv/v_1", params: p("sorted", "true")},
	{name: "list-recursive", method: "GET", key: "/torchelastic/p2p", params: p("recursive", "true", "sorted", "true")},
	{name: "cad-wrong", method: "DELETE", key: "/torchelastic/p2p/run_1/rdzv/v_1/extra_data", params: p("prevValue", "no")},
	{name: "cad", method: "DELETE", key: "/torchelastic/p2p/run_1/rdzv/v_1/extra_data", params: p("prevValue", `{"a": 1}`)},
	{name: "wait-key", method: "GET", key: "/torchelastic/p2p/run_1/rdzv/active_version", params: p("wait", "true", "waitIndex", "{idx+1}"),
		during: []step{{name: "trigger-cas", method: "PUT", key: "/torchelastic/p2p/run_1/rdzv/active_version", params: p("value", "final", "prevExist", "true")}}},
	{name: "wait-recursive", method: "GET", key: "/torch/elastic/store", params: p("wait", "true", "recursive", "true", "waitIndex", "{idx+1}"),
		during: []step{{name: "trigger-store-set", method: "PUT", key: "/torch/elastic/store/a2V5", params: p("value", "dmFsdWU=")}}},
	{name: "wait-history", method: "GET", key: "/torch/elastic/store/a2V5", params: p("wait", "true", "waitIndex", "{mod:trigger-store-set}")},
	{name: "etcd-v2-create-state", method: "PUT", key: "/torch/elastic/rendezvous/job1", params: p("value", `{"state": 1}`, "prevExist", "false", "ttl", "7200")},
	{name: "etcd-v2-heartbeat-cas", method: "PUT", key: "/torch/elastic/rendezvous/job1", params: p("value", `{"state": 2}`, "prevIndex", "{mod:etcd-v2-create-state}", "ttl", "7200")},
	{name: "post-in-order", method: "POST", key: "/queue", params: p("value", "first")},
	{name: "post-in-order-2", method: "POST", key: "/queue", params: p("value", "second")},
	{name: "list-queue-sorted", method: "GET", key: "/queue", params: p("sorted", "true", "recursive", "true")},
	{name: "ttl-key", method: "PUT", key: "/short", params: p("value", "v", "ttl", "1")},
	{name: "wait-expire", method: "GET", key: "/short", params: p("wait", "true", "waitIndex", "{idx+1}")},
	{name: "get-expired", method: "GET", key: "/short"},
	{name: "delete-dir-not-empty", method: "DELETE", key: "/torchelastic/p2p/run_1/rdzv", params: p("dir", "true")},
	{name: "delete-file-as-dir", method: "DELETE", key: "/torch/elastic/store/a2V5", params: p("dir", "true")},
	{name: "delete-dir-without-dir", method: "DELETE", key: "/queue"},
	{name: "delete-dir-recursive", method: "DELETE", key: "/queue", params: p("recursive", "true")},
	{name: "delete-missing", method: "DELETE", key: "/queue"},
	{name: "set-under-file", method: "PUT", key: "/torch/elastic/store/a2V5/child", params: p("value", "x")},
	{name: "set-value-on-dir", method: "PUT", key: "/torchelastic/p2p", params: p("value", "x")},
	{name: "update-dir-with-value", method: "PUT", key: "/torchelastic/p2p", params: p("value", "x", "prevExist", "true")},
	{name: "set-root", method: "PUT", key: "/", params: p("value", "x")},
	{name: "get-root", method: "GET", key: "/", params: p("recursive", "false", "sorted", "true")}, // unsorted, both list in map order
	{name: "bad-ttl", method: "PUT", key: "/k", params: p("value", "x", "ttl", "abc")},
	{name: "bad-prevIndex", method: "PUT", key: "/k", params: p("value", "x", "prevIndex", "-1")},
	{name: "bad-waitIndex", method: "GET", key: "/k", params: p("wait", "true", "waitIndex", "x")},
	{name: "bad-bool", method: "GET", key: "/k", params: p("recursive", "maybe")},
	{name: "bad-prevExist", method: "PUT", key: "/k", params: p("value", "x", "prevExist", "perhaps")},
	{name: "empty-prevValue", method: "PUT", key: "/k", params: p("value", "x", "prevValue", "")},
	{name: "wait-on-put", method: "PUT", key: "/k", params: p("value", "x", "wait", "true")},
	{name: "set-plain", method: "PUT", key: "/k", params: p("value", "x")},
	{name: "set-plain-again", method: "PUT", key: "/k", params: p("value", "y")},
	{name: "no-value-on-success", method: "PUT", key: "/k", params: p("value", "z", "noValueOnSuccess", "true")},
	{name: "create-dir-over-file", method: "PUT", key: "/k", params: p("dir", "true", "prevExist", "false")},
	{name: "patch-not-allowed", method: "PATCH", key: "/k"},
}

func TestConformanceWithEtcd34(t *testing.T) {
	ref := testenv.Etcd34(t)
	ours := httptest.NewServer(newTestServer(t).mux())
	t.Cleanup(ours.Close)

	want := (&runner{t: t, base: ref, mods: map[string]uint64{}}).run(torchScript)
	got := (&runner{t: t, base: ours.URL, mods: map[string]uint64{}}).run(torchScript)
	require.Len(t, got, len(want))
	if testing.Verbose() {
		for _, r := range got {
			t.Logf("%s: %d %v", r.Step, r.Status, r.Body)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("v2 API differs from etcd 3.4 --enable-v2 (-etcd +sidecar):\n%s", diff)
	}
}

// TestConformanceEventIndexCleared: a wait on an index older than the last
// 1000 events is error 401 on both (torch tolerates it).
func TestConformanceEventIndexCleared(t *testing.T) {
	ref := testenv.Etcd34(t)
	ours := httptest.NewServer(newTestServer(t).mux())
	t.Cleanup(ours.Close)
	script := []step{{name: "first", method: "PUT", key: "/a", params: p("value", "0")}}
	for i := range 1010 {
		script = append(script, step{name: "w", method: "PUT", key: "/b", params: p("value", fmt.Sprint(i))})
	}
	script = append(script, step{name: "old-wait", method: "GET", key: "/a", params: p("wait", "true", "waitIndex", "{mod:first}")})
	want := (&runner{t: t, base: ref, mods: map[string]uint64{}}).run(script)
	got := (&runner{t: t, base: ours.URL, mods: map[string]uint64{}}).run(script)
	require.Equal(t, want[len(want)-1], got[len(got)-1])
	require.Equal(t, 400, got[len(got)-1].Status)
}
