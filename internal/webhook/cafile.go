package webhook

import (
	"crypto/x509"
	"errors"
	"os"
	"sync"

	"github.com/go-logr/logr"
)

// caFile is the CA of the webhook's serving certificate as serving sidecars get it (mutate.PodReplacement.CA): the
// certificate directory's ca.crt, read again when it changes. A rotation rewrites it (atomically: a new file), a
// Secret volume swaps it under a symlink, and cert-manager's and the chart's Secrets carry it beside the pair, so
// the file is read per admission, not once; its modification time, size and identity say when to read it again,
// so an admission costs a stat.
type caFile struct {
	path string
	log  logr.Logger

	mu     sync.Mutex
	fi     os.FileInfo // of pem; nil: none read
	pem    []byte
	warned bool // since the last good read
}

// load is the CA now, or nil when there is none that a sidecar could use: then no pod is given the means to ask
// for a replacement, and its hangs restart its round and nothing more.
func (c *caFile) load() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	fi, err := os.Stat(c.path)
	if err == nil && c.fi != nil && os.SameFile(fi, c.fi) && fi.ModTime().Equal(c.fi.ModTime()) && fi.Size() == c.fi.Size() {
		return c.pem
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(c.path)
	}
	if err == nil && !x509.NewCertPool().AppendCertsFromPEM(b) {
		// The sidecar's client refuses it too (podreplace.NewClient): better no replacement than a failing one.
		err = errors.New("no PEM certificate in it")
	}
	if err != nil {
		if !c.warned {
			c.log.Info("no usable CA of the serving certificate: serving sidecars admitted from now on will not ask for pod replacements",
				"file", c.path, "err", err.Error())
			c.warned = true
		}
		c.fi, c.pem = nil, nil
		return nil
	}
	if c.warned || c.fi != nil {
		c.log.Info("CA of the serving certificate read", "file", c.path)
	}
	c.fi, c.pem, c.warned = fi, b, false
	return c.pem
}
