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
	rdzvClientPort    = strconv.Itoa(constants.RdzvClientPort)
	c10dPort          = strconv.Itoa(constants.C10dPort)
	// c10dLocal is where a PyTorch trainer reaches the c10d store: its own
	// pod's sidecar, which serves the store (serve) or carries the connections
	// to it while the pod is a member (join --c10d-addr, internal/storeproxy).
	c10dLocal         = "127.0.0.1:" + c10dPort
	sidecarHealthAddr = ":" + strconv.Itoa(constants.SidecarHealthPort)
)

// scheme is the rendezvous URLs' scheme: https with a TLS Secret, http without.
func scheme(s *settings) string {
	if s.tlsSecret != "" {
		return "https"
	}
	return "http"
}
