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
	sidecarHealthAddr = ":" + strconv.Itoa(constants.SidecarHealthPort)
)

// scheme is the rendezvous URLs' scheme: https with a TLS Secret, http without.
func scheme(s *settings) string {
	if s.tlsSecret != "" {
		return "https"
	}
	return "http"
}
