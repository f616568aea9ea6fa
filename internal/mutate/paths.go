package mutate

import (
	"path"
	"strconv"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// Paths and ports as the sidecar's and the trainer's settings spell them,
// worked out once rather than for every pod.
var (
	tlsCertFile       = path.Join(constants.TLSDir, constants.TLSCertName)
	tlsKeyFile        = path.Join(constants.TLSDir, constants.TLSKeyName)
	tlsCAFile         = path.Join(constants.TLSDir, constants.TLSCAName)
	hostfilePath      = path.Join(constants.FilesDir, constants.HostfileName)
	discoverHostsPath = path.Join(constants.FilesDir, constants.DiscoverHostsName)
	// The rendezvous Service's ports: fixed, whatever ports its pods listen on (it maps them).
	svcClientPort = strconv.Itoa(constants.RdzvClientPort)
	svcC10dPort   = strconv.Itoa(constants.C10dPort)
)

func port(p int32) string { return strconv.Itoa(int(p)) }

// c10dLocal is where a PyTorch trainer reaches the c10d store: its own pod's
// sidecar, which serves the store (serve) or carries the connections to it
// while the pod is a member (join --c10d-addr, internal/storeproxy).
func (s *settings) c10dLocal() string { return "127.0.0.1:" + port(s.ports.C10d) }

// healthAddr is where the sidecar serves /healthz, /readyz and /metrics.
func (s *settings) healthAddr() string { return ":" + port(s.ports.Health) }

// scheme is the rendezvous URLs' scheme: https with a TLS Secret, http without.
func scheme(s *settings) string {
	if s.tlsSecret != "" {
		return "https"
	}
	return "http"
}
