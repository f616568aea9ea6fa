package webhook

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testcert"
)

// logLines is a logger that keeps its lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{})
}

func (l *logLines) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}

func newCA(t *testing.T) []byte {
	t.Helper()
	pair, err := testcert.New("127.0.0.1")
	require.NoError(t, err)
	return pair.CA
}

// The CA is read again when its file changes, kept while it does not, and missing, unreadable or not PEM it is
// none, said once until it is back.
func TestCAFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, constants.TLSCAName)
	var logs logLines
	c := &caFile{path: path, log: logs.logger()}

	require.Nil(t, c.load(), "no file yet")
	require.Nil(t, c.load())
	assert.Equal(t, 1, logs.count("no usable CA"), "said once")

	ca1, ca2 := newCA(t), newCA(t)
	require.NoError(t, os.WriteFile(path, ca1, 0o644))
	require.Equal(t, ca1, c.load())
	assert.Equal(t, 1, logs.count("CA of the serving certificate read"), "its return is said")

	// Written in place with the same size and modification time: the stat says nothing changed, so it is not read.
	st, err := os.Stat(path)
	require.NoError(t, err)
	same := []byte(strings.Repeat("x", len(ca1)))
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.Write(same)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.Chtimes(path, st.ModTime(), st.ModTime()))
	require.Equal(t, ca1, c.load(), "cached while its stat is the same")

	// A rotation writes a new file and renames it over the old one (internal/atomicfile), at any time.
	tmp := filepath.Join(dir, ".ca.tmp")
	require.NoError(t, os.WriteFile(tmp, ca2, 0o644))
	require.NoError(t, os.Chtimes(tmp, st.ModTime(), st.ModTime()))
	require.NoError(t, os.Rename(tmp, path))
	require.Equal(t, ca2, c.load(), "a new file, even of the same time")

	require.NoError(t, os.WriteFile(path, []byte("not a certificate"), 0o644))
	require.Nil(t, c.load(), "not PEM: the sidecar could not use it")
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.Mkdir(path, 0o755))
	require.Nil(t, c.load(), "unreadable")
	assert.Equal(t, 2, logs.count("no usable CA"), "said once per absence")
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.WriteFile(path, ca1, 0o644))
	require.Equal(t, ca1, c.load())
}
