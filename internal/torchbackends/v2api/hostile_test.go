package v2api

import (
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A key that ".." (escaped or not) would take out of the keys' namespace is
// refused with etcd's error for a path outside /v2/keys, and stores nothing.
func TestKeyEscapeRefused(t *testing.T) {
	s := &testServer{New(Config{})}
	h := s.mux()
	for _, target := range []string{"/v2/keys/a/..%2f..%2f0%2fprobe", "/v2/keys/..%2f0%2fx", "/v2/keys/%2e%2e/0/x"} {
		code, body := do(t, h, "PUT", target, "value=1")
		require.Equal(t, 400, code, target)
		require.Contains(t, body, `"errorCode":210`, target)
		require.Contains(t, body, "incorrect key prefix", target)
	}
	_, err := s.Store().Get("/0/probe", false, false)
	require.Error(t, err, "nothing stored outside /1")
	// ".." that stays inside is cleaned, as etcd cleans it.
	code, _ := do(t, h, "PUT", "/v2/keys/a/..%2fb", "value=1")
	require.Equal(t, 201, code)
	v, ok := s.Value("/b")
	require.True(t, ok)
	require.Equal(t, "1", v)
}

// FuzzKeyPath: whatever a client names, the store's path stays in /1.
func FuzzKeyPath(f *testing.F) {
	for _, k := range []string{"/a/b", "/a/../../0/x", "/../1/x", "", "/", "/%2e%2e", "//x"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		p, ok := keyPath(key)
		if ok && p != storeKeysPrefix && !strings.HasPrefix(p, storeKeysPrefix+"/") {
			t.Fatalf("%q -> %q accepted outside %s", key, p, storeKeysPrefix)
		}
		if !ok {
			return
		}
		// Through the handler too: an accepted key is stored inside /1.
		s := &testServer{New(Config{})}
		target := "/v2/keys" + (&url.URL{Path: "/" + strings.TrimPrefix(key, "/")}).EscapedPath()
		if _, err := url.ParseRequestURI(target); err != nil {
			return
		}
		do(t, s.mux(), "PUT", target, "value=1")
		ev, err := s.Store().Get("/0", true, true)
		require.NoError(t, err)
		require.Empty(t, ev.Node.Nodes, "a key stored in /0 from %q", key)
	})
}

// A deleted or expired value is not in the snapshot a graceful shutdown
// leaves on disk; live values and the event history's keys are.
func TestSnapshotForgetsDeleted(t *testing.T) {
	a := &testServer{New(Config{})}
	h := a.mux()
	do(t, h, "PUT", "/v2/keys/secret", "value=hunter2")
	do(t, h, "DELETE", "/v2/keys/secret", "")
	do(t, h, "PUT", "/v2/keys/kept", "value=v1")
	snap, err := a.Snapshot()
	require.NoError(t, err)
	require.NotContains(t, string(snap), "hunter2")
	require.Contains(t, string(snap), "v1")
	require.Contains(t, string(snap), `/1/secret`, "the events stay")
	b := &testServer{New(Config{})}
	require.NoError(t, b.Restore(snap))
	v, ok := b.Value("/kept")
	require.True(t, ok)
	require.Equal(t, "v1", v)
	require.Equal(t, a.Store().Index(), b.Store().Index())
}
