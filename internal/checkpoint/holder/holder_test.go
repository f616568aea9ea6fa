package holder

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/checkpoint"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/etcdtest"
)

const (
	prefix    = "/test/checkpoints/"
	incidents = "/test/incidents/"
)

// pod is one pod's holder on its own loopback address (127.0.0.N), all on one port, as pods of a job are.
type pod struct {
	host, dir string
	h         *Holder
	cancel    context.CancelFunc
	done      chan struct{}
	logs      *testenv.SyncBuffer
}

type job struct {
	t       *testing.T
	cli     *clientv3.Client
	port    int
	mu      sync.Mutex
	members []checkpoint.Holder
}

func newJob(t *testing.T) *job {
	return &job{t: t, cli: etcdtest.Embedded(t), port: testenv.FreePort(t)}
}

func (j *job) listed() []checkpoint.Holder {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]checkpoint.Holder(nil), j.members...)
}

func (j *job) start(n int, node string, memory int64) *pod {
	t := j.t
	p := &pod{host: fmt.Sprintf("127.0.0.%d", n), dir: t.TempDir(), done: make(chan struct{}), logs: &testenv.SyncBuffer{}}
	j.mu.Lock()
	j.members = append(j.members, checkpoint.Holder{Host: p.host, Node: node})
	j.mu.Unlock()
	p.h = New(Config{Dir: p.dir, Self: p.host, Replicas: 1, Memory: memory, Client: j.cli, Prefix: prefix, IncidentKey: incidents + p.host,
		Members: j.listed, PeerPort: j.port, TTL: 2 * time.Second, Tick: 50 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(p.logs, nil))})
	ln, err := net.Listen("tcp", net.JoinHostPort(p.host, fmt.Sprint(j.port)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() { p.h.ServeListener(ctx, ln) }()
	go func() { defer close(p.done); p.h.Run(ctx) }()
	t.Cleanup(p.stop)
	return p
}

func (p *pod) stop() { p.cancel(); <-p.done }

// leave takes the pod out of the members (its lease ended with its node).
func (j *job) leave(p *pod) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i, m := range j.members {
		if m.Host == p.host {
			j.members = append(j.members[:i], j.members[i+1:]...)
			return
		}
	}
}

// save writes what a trainer's rank writes: its DCP files, then its manifest.
func (p *pod) save(t *testing.T, step int64, id string, rank, world int, size int) checkpoint.Manifest {
	name := checkpoint.SaveName(step, id)
	dir := filepath.Join(p.dir, name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	files := map[string][]byte{fmt.Sprintf("__%d_0.distcp", rank): content(name, rank, size)}
	if rank == 0 {
		files[".metadata"] = []byte("metadata of " + name)
	}
	m := checkpoint.Manifest{Save: name, Step: step, Rank: rank, World: world}
	for f, data := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), data, 0o644))
		m.Files = append(m.Files, checkpoint.File{Name: f, Size: int64(len(data))})
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("rank-%d.json", rank)), m.Encode(), 0o644))
	p.h.Wake()
	return m
}

func content(save string, rank, size int) []byte {
	return []byte(strings.Repeat(fmt.Sprintf("%s/%d;", save, rank), size/20+1))[:size]
}

func (p *pod) url(path string) string {
	return "http://" + net.JoinHostPort(p.host, fmt.Sprint(p.h.cfg.PeerPort)) + path
}

func (p *pod) newest(t *testing.T) (checkpoint.Manifest, int) {
	resp, err := http.Get(p.url("/checkpoint/newest"))
	require.NoError(t, err)
	defer resp.Body.Close()
	var m checkpoint.Manifest
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
	}
	return m, resp.StatusCode
}

func has(dir, save, file string) bool {
	_, err := os.Stat(filepath.Join(dir, save, file))
	return err == nil
}

// Two pods on two nodes, each saving its rank: each holds a copy of the other's piece, a newer complete step
// makes them drop the older one, and the survivor of a loss still has the whole newest step.
func TestReplicates(t *testing.T) {
	j := newJob(t)
	a, b := j.start(1, "n1", 1<<20), j.start(2, "n2", 1<<20)
	s1 := checkpoint.SaveName(1, "aaaaaaaa")
	_, status := a.newest(t)
	assert.Equal(t, http.StatusNotFound, status, "nothing saved yet")

	a.save(t, 1, "aaaaaaaa", 0, 2, 1000)
	_, status = a.newest(t)
	assert.Equal(t, http.StatusNotFound, status, "rank 1 not saved: not complete")
	b.save(t, 1, "aaaaaaaa", 1, 2, 1000)
	testenv.Eventually(t, 10*time.Second, "each holds the other's piece", func() error {
		if !has(a.dir, s1, "copy-1.json") || !has(b.dir, s1, "copy-0.json") {
			return fmt.Errorf("a: %v, b: %v", has(a.dir, s1, "copy-1.json"), has(b.dir, s1, "copy-0.json"))
		}
		return nil
	})
	got, err := os.ReadFile(filepath.Join(a.dir, s1, "__1_0.distcp"))
	require.NoError(t, err)
	assert.Equal(t, content(s1, 1, 1000), got)
	m, status := b.newest(t)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, s1, m.Save)

	s2 := checkpoint.SaveName(2, "bbbbbbbb")
	a.save(t, 2, "bbbbbbbb", 0, 2, 1000)
	b.save(t, 2, "bbbbbbbb", 1, 2, 1000)
	testenv.Eventually(t, 10*time.Second, "step 2 replicated and step 1 dropped", func() error {
		if !has(a.dir, s2, "copy-1.json") || !has(b.dir, s2, "copy-0.json") {
			return fmt.Errorf("step 2 not replicated")
		}
		if has(a.dir, s1, "") || has(b.dir, s1, "") {
			return fmt.Errorf("step 1 still there")
		}
		return nil
	})

	// b's node is lost: its lease ends, it leaves the members; a still has all of step 2.
	b.stop()
	j.leave(b)
	testenv.Eventually(t, 10*time.Second, "b's announcements gone", func() error {
		resp, err := j.cli.Get(context.Background(), prefix, clientv3.WithPrefix())
		if err != nil {
			return err
		}
		for _, kv := range resp.Kvs {
			if strings.HasSuffix(string(kv.Key), "/"+b.host) {
				return fmt.Errorf("still %s", kv.Key)
			}
		}
		return nil
	})
	m, status = a.newest(t)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, s2, m.Save)
	resp, err := http.Get(a.url("/checkpoint/files/" + s2 + "/__1_0.distcp"))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, content(s2, 1, 1000), body, "the lost pod's piece, from a's copy")
}

// A pod that holds no piece of a save reads it through its sidecar from the peers that do, ranges too.
func TestFilesThroughPeer(t *testing.T) {
	j := newJob(t)
	a := j.start(1, "n1", 1<<20)
	a.save(t, 3, "cccccccc", 0, 1, 5000)
	s := checkpoint.SaveName(3, "cccccccc")
	c := j.start(3, "n1", 1) // no room for a copy: reads through
	testenv.Eventually(t, 10*time.Second, "c sees the save", func() error {
		if _, status := c.newest(t); status != http.StatusOK {
			return fmt.Errorf("newest: %d", status)
		}
		return nil
	})
	req, _ := http.NewRequest(http.MethodGet, c.url("/checkpoint/files/"+s+"/__0_0.distcp"), nil)
	req.Header.Set("Range", "bytes=100-199")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusPartialContent, resp.StatusCode)
	assert.Equal(t, content(s, 0, 5000)[100:200], body)
	assert.False(t, has(c.dir, s, "__0_0.distcp"), "a copy that does not fit is not fetched")
	testenv.Eventually(t, 5*time.Second, "the refusal is logged with its figures", func() error {
		if !strings.Contains(c.logs.String(), "does not fit in checkpoint.memory") {
			return fmt.Errorf("not logged")
		}
		return nil
	})

	for path, status := range map[string]int{
		"/checkpoint/files/" + s + "/nope":        http.StatusNotFound,
		"/checkpoint/files/" + s + "/..":          http.StatusNotFound, // cleaned by the mux to a path it has no route for
		"/checkpoint/files/not-a-save/x":          http.StatusBadRequest,
		"/checkpoint/peer/" + s + "/__0_0.distcp": http.StatusNotFound, // c holds no piece of it
	} {
		resp, err := http.Get(c.url(path))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, status, resp.StatusCode, path)
	}
}

// A peer that announces a piece and serves other bytes, or too few, never leaves a file that a load would read.
func TestRefusesBadPeer(t *testing.T) {
	j := newJob(t)
	a := j.start(1, "n1", 1<<20)
	s := checkpoint.SaveName(4, "dddddddd")
	good := content(s, 0, 1000)
	sum := sha256.Sum256(good)
	m := checkpoint.Manifest{Save: s, Step: 4, Rank: 0, World: 1,
		Files: []checkpoint.File{{Name: "__0_0.distcp", Size: 1000, SHA256: hex.EncodeToString(sum[:])}}}
	for n, serve := range map[int]func(w http.ResponseWriter){
		8: func(w http.ResponseWriter) { w.Write([]byte(strings.Repeat("x", 1000))) }, // other bytes
		9: func(w http.ResponseWriter) { w.Write(good[:500]) },                        // truncated
	} {
		host := fmt.Sprintf("127.0.0.%d", n)
		ln, err := net.Listen("tcp", net.JoinHostPort(host, fmt.Sprint(j.port)))
		require.NoError(t, err)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { serve(w) })}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		value, _ := json.Marshal(announcement{Origin: true, Manifest: m})
		_, err = j.cli.Put(context.Background(), prefix+s+"/0/"+host, string(value))
		require.NoError(t, err)
	}
	// Not members (a is the only one): the piece should be on a, which fetches it from either.
	testenv.Eventually(t, 10*time.Second, "both peers tried and refused", func() error {
		logs := a.logs.String()
		if !strings.Contains(logs, "do not match its checksum") || !strings.Contains(logs, "500 bytes, expected 1000") {
			return fmt.Errorf("logs: %s", logs)
		}
		return nil
	})
	entries, _ := os.ReadDir(filepath.Join(a.dir, s))
	assert.Empty(t, entries, "nothing of the bad copies is left")
}

func TestParseAnnouncement(t *testing.T) {
	s := checkpoint.SaveName(1, "aaaaaaaa")
	m := checkpoint.Manifest{Save: s, Step: 1, Rank: 0, World: 1,
		Files: []checkpoint.File{{Name: "f", Size: 1, SHA256: strings.Repeat("a", 64)}}}
	good, _ := json.Marshal(announcement{Origin: true, Manifest: m})
	p, holder, a, err := parseAnnouncement(prefix, prefix+s+"/0/h", good)
	require.NoError(t, err)
	assert.Equal(t, checkpoint.Piece{Save: s, Rank: 0}, p)
	assert.Equal(t, "h", holder)
	assert.True(t, a.Origin)
	noSum := m
	noSum.Files = []checkpoint.File{{Name: "f", Size: 1}}
	unsummed, _ := json.Marshal(announcement{Manifest: noSum})
	for key, value := range map[string][]byte{
		prefix + s + "/0":           good,
		prefix + s + "/00/h":        good,
		prefix + s + "/1/h":         good, // another piece than its value
		prefix + "x/0/h":            good,
		prefix + s + "/0/h/extra":   good,
		prefix + s + "/0/h" + " ":   []byte(`{"origin":true,"manifest":{},"x":1}`),
		prefix + s + "/0/unsummed":  unsummed,
		prefix + s + "/0/notjson":   []byte("{"),
		prefix + s + "/0/big-value": []byte(strings.Repeat(" ", 1<<20+1)),
		"/elsewhere/" + s + "/0/h":  good,
	} {
		_, _, _, err := parseAnnouncement(prefix, key, value)
		assert.Error(t, err, key)
	}
}

func FuzzParseAnnouncement(f *testing.F) {
	s := checkpoint.SaveName(1, "aaaaaaaa")
	f.Add(prefix+s+"/0/h", []byte(`{"origin":true,"manifest":{"save":"`+s+`","step":1,"rank":0,"world":1,"files":[{"name":"f","size":1,"sha256":"`+strings.Repeat("a", 64)+`"}]}}`))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		p, holder, a, err := parseAnnouncement(prefix, key, value)
		if err != nil || a == nil {
			return
		}
		assert.NotContains(t, holder, "/")
		assert.Equal(t, p.Save, a.Manifest.Save)
		assert.NoError(t, checkpoint.NewIndex().Announce(holder, a.Origin, a.Manifest))
	})
}

// incident is what the pod's holder last recorded as its incident, if anything.
func (j *job) incident(p *pod) (checkpoint.Incident, bool) {
	resp, err := j.cli.Get(context.Background(), incidents+p.host)
	require.NoError(j.t, err)
	if len(resp.Kvs) == 0 {
		return checkpoint.Incident{}, false
	}
	in, err := checkpoint.ParseIncident(resp.Kvs[0].Value)
	require.NoError(j.t, err, "the holder writes what the serving sidecar parses")
	return in, true
}

// What did not fit is recorded for an Event, with the figures: the trainer's refused save (its word, checked
// strictly; a bad one is refused with 400 and records nothing), and a copy that does not fit beside the pod's own
// next save.
func TestIncidents(t *testing.T) {
	j := newJob(t)
	a, b := j.start(1, "n1", 1<<20), j.start(2, "n2", 3000)
	post := func(body string) int {
		resp, err := http.Post(a.url("/checkpoint/refused"), "application/json", strings.NewReader(body))
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, bad := range []string{`{"kind":"copy","step":1,"rank":0,"need":1,"free":0}`, `{"kind":"save","step":1}`, `{"kind":"save","step":1,"rank":0,"need":5,"free":1,"host":"other"}x`, strings.Repeat("{", 5000)} {
		require.Equal(t, http.StatusBadRequest, post(bad), bad)
	}
	_, ok := j.incident(a)
	require.False(t, ok, "a refused request records nothing")
	require.Equal(t, http.StatusNoContent, post(`{"kind":"save","step":12,"rank":3,"need":5000000,"free":1000}`))
	in, ok := j.incident(a)
	require.True(t, ok)
	require.Equal(t, checkpoint.Incident{Kind: checkpoint.IncidentSave, Host: a.host, Step: 12, Rank: 3, Need: 5000000, Free: 1000, Memory: 1 << 20}, in)

	// b holds 3000 bytes: its own save of 1500 and room kept for its next leave no room for a's 2000.
	b.save(t, 1, "aaaaaaaa", 1, 2, 1500)
	a.save(t, 1, "aaaaaaaa", 0, 2, 2000)
	testenv.Eventually(t, 10*time.Second, "b records the copy it has no room for", func() error {
		in, ok := j.incident(b)
		if !ok {
			return fmt.Errorf("nothing recorded; b's log: %s", b.logs.String())
		}
		if in.Kind != checkpoint.IncidentCopy || in.Rank != 0 || in.Step != 1 || in.Host != b.host || in.Memory != 3000 {
			return fmt.Errorf("recorded %+v", in)
		}
		return nil
	})
}

// The trainer's routes answer only the pod's own loopback: a peer (any address of the pod network) is refused
// before anything is read or recorded.
func TestTrainerRoutesAreLoopbackOnly(t *testing.T) {
	j := newJob(t)
	a := j.start(1, "n1", 1<<20)
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/checkpoint/newest", ""},
		{"GET", "/checkpoint/files/" + checkpoint.SaveName(1, "aaaaaaaa") + "/__0_0.distcp", ""},
		{"POST", "/checkpoint/saved", ""},
		{"POST", "/checkpoint/refused", `{"kind":"save","step":1,"rank":0,"need":5,"free":1}`},
	} {
		req := httptest.NewRequest(r.method, r.path, strings.NewReader(r.body))
		req.RemoteAddr = "10.244.1.7:40000"
		rec := httptest.NewRecorder()
		a.h.Handler().ServeHTTP(rec, req)
		assert.Equal(t, http.StatusForbidden, rec.Code, "%s %s from a peer", r.method, r.path)
	}
	_, ok := j.incident(a)
	assert.False(t, ok, "a peer's refused save records nothing")
}

// The trainer's hard links of a save it copies to the volume count once in what the directory holds.
func TestUsageCountsLinksOnce(t *testing.T) {
	dir := t.TempDir()
	save := filepath.Join(dir, checkpoint.SaveName(1, "aaaaaaaa"))
	require.NoError(t, os.MkdirAll(save, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(save, "__0_0.distcp"), make([]byte, 1000), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(save, "rank-0.json"), make([]byte, 10), 0o644))
	stage := filepath.Join(dir, ".persist-1-"+filepath.Base(save))
	require.NoError(t, os.MkdirAll(stage, 0o755))
	require.NoError(t, os.Link(filepath.Join(save, "__0_0.distcp"), filepath.Join(stage, "__0_0.distcp")))
	n, err := usage(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(1010), n)
	require.NoError(t, os.RemoveAll(save)) // the sidecar drops the save; the copy's link still holds the bytes
	n, err = usage(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(1000), n)
}

// Host networking: the loopback is the node's, so the peers' handler answers no trainer route, not even from
// loopback, and the trainer's routes answer on a Unix socket of the pod's (LocalHandler), to whoever reaches it.
func TestHostNetworkRoutes(t *testing.T) {
	j := newJob(t)
	a := j.start(1, "n1", 1<<20)
	for _, r := range []struct{ method, path string }{
		{"GET", "/checkpoint/newest"},
		{"GET", "/checkpoint/files/" + checkpoint.SaveName(1, "aaaaaaaa") + "/__0_0.distcp"},
		{"POST", "/checkpoint/saved"},
		{"POST", "/checkpoint/refused"},
	} {
		req := httptest.NewRequest(r.method, r.path, strings.NewReader(""))
		req.RemoteAddr = "127.0.0.1:40000" // another host-network pod of the node
		rec := httptest.NewRecorder()
		a.h.PeerHandler().ServeHTTP(rec, req)
		assert.Equal(t, http.StatusNotFound, rec.Code, "%s %s on the peers' port", r.method, r.path)
	}

	sock := filepath.Join(t.TempDir(), "checkpoint.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.h.ServeHandler(ctx, ln, a.h.LocalHandler())
	cli := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := cli.Post("http://localhost/checkpoint/refused", "application/json",
		strings.NewReader(`{"kind":"save","step":3,"rank":1,"need":5000000,"free":1}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	in, ok := j.incident(a)
	require.True(t, ok, "the trainer's refused save, told on the socket, is recorded")
	assert.Equal(t, int64(3), in.Step)
	resp, err = cli.Get("http://localhost/checkpoint/newest")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, string(body), "no complete checkpoint in the job", "the route answers (no save yet)")
}
