package mutate

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/podreplace"
)

// Config is the webhook's own configuration (its flags).
type Config struct {
	// SidecarImage is the rdzv-sidecar image; its entrypoint is the rdzv-sidecar binary.
	SidecarImage string
	// SidecarImagePullPolicy; empty leaves Kubernetes' default.
	SidecarImagePullPolicy corev1.PullPolicy
	// ClusterDomain is the cluster DNS domain (default cluster.local).
	ClusterDomain string
	// ExtraAccelerators are resource names counted as accelerators besides the built-in ones.
	ExtraAccelerators []string
	// WebhookNamespace is the namespace the webhook runs in; its pods are never mutated.
	WebhookNamespace string
	// Version is the webhook's release (its chart's version), named when a pod of a newer contract is denied.
	Version string
	// Defaults for settings a pod does not carry.
	Defaults Defaults
	// PodReplacement, when its URL is set, lets a serving sidecar ask the webhook to replace a pod of its job
	// after repeated hangs blamed on it (internal/podreplace): the sidecar gets the URL, the CA and a token for it.
	PodReplacement PodReplacement
}

// PodReplacement is where a serving sidecar asks for a replacement: the webhook's URL (https, podreplace.Path) and
// the CA of its serving certificate (PEM). Without both, a pod's hangs restart its round and nothing more.
type PodReplacement struct {
	URL string
	CA  []byte
}

// Defaults are the values used when a pod's annotations do not say otherwise.
// The rendezvous timeouts are chosen for fast scale-up and scale-down (see
// docs/contract.md): torchrun's own last_call_timeout of 30 s makes every
// elastic start wait 30 s; 2 s is enough for pods created together.
type Defaults struct {
	RdzvBackend          string
	JoinTimeout          int // seconds an agent waits for min nodes
	LastCallTimeout      int // seconds to wait for more nodes once min is reached
	CloseTimeout         int // seconds to wait for a closing rendezvous
	KeepAliveInterval    int // seconds between rendezvous heartbeats (torch >= 2.3)
	KeepAliveMaxAttempts int // missed heartbeats before a node is dropped (torch >= 2.3)
	MaxRestarts          int
	MonitorInterval      float64 // seconds between torchrun's checks for waiting nodes, for a small job
	MPIFlavour           string
	SidecarResources     SidecarResources
}

// SidecarResources are the sidecar's resource requirements per mode.
type SidecarResources struct {
	Serve corev1.ResourceRequirements
	Join  corev1.ResourceRequirements
}

// DefaultConfig returns the configuration the webhook uses without flags
// (the sidecar image excepted, which has no sensible default).
func DefaultConfig() Config {
	return Config{
		ClusterDomain: naming.DefaultClusterDomain,
		Defaults: Defaults{
			RdzvBackend:          constants.BackendEtcdV2,
			JoinTimeout:          600,
			LastCallTimeout:      2,
			CloseTimeout:         10,
			KeepAliveInterval:    2,
			KeepAliveMaxAttempts: 3,
			MaxRestarts:          3,
			MonitorInterval:      0.1, // torch's own default (2.6, 2.14)
			MPIFlavour:           constants.FlavourOpenMPI,
			SidecarResources: SidecarResources{
				Serve: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{
						corev1.ResourceCPU:    resource.MustParse("50m"),
						corev1.ResourceMemory: resource.MustParse("64Mi"),
					},
					Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
				},
				Join: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{
						corev1.ResourceCPU:    resource.MustParse("10m"),
						corev1.ResourceMemory: resource.MustParse("32Mi"),
					},
					Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
				},
			},
		},
	}
}

// Validate checks a configuration before the webhook serves with it; its
// messages name the webhook's flags.
func (c Config) Validate() error {
	d := c.Defaults
	oneOf := func(flag, v string, valid []string) error {
		if slices.Contains(valid, v) {
			return nil
		}
		return fmt.Errorf("--%s=%q: want one of %s", flag, v, strings.Join(valid, ", "))
	}
	switch {
	case c.SidecarImage == "":
		return fmt.Errorf("--sidecar-image is required")
	case d.JoinTimeout < 1 || d.LastCallTimeout < 1 || d.CloseTimeout < 1 ||
		d.KeepAliveInterval < 1 || d.KeepAliveMaxAttempts < 1 || d.MaxRestarts < 0:
		return fmt.Errorf("timeouts, intervals and attempts must be >= 1 and --default-max-restarts >= 0")
	case !(d.MonitorInterval >= MinMonitorInterval && d.MonitorInterval <= MaxMonitorInterval):
		return fmt.Errorf("--default-monitor-interval=%v: want seconds from %v to %v", d.MonitorInterval, MinMonitorInterval, MaxMonitorInterval)
	}
	if u := c.PodReplacement.URL; u != "" {
		// The sidecar refuses anything else (podreplace.NewClient): fail here, not in every serving pod.
		if err := podreplace.CheckURL(u); err != nil {
			return fmt.Errorf("--pod-replacement-url=%w", err)
		}
	}
	if err := oneOf("default-rdzv-backend", d.RdzvBackend, constants.Backends); err != nil {
		return err
	}
	if err := oneOf("default-mpi-flavour", d.MPIFlavour, constants.MPIFlavours); err != nil {
		return err
	}
	if c.SidecarImagePullPolicy != "" {
		return oneOf("sidecar-image-pull-policy", string(c.SidecarImagePullPolicy), constants.PullPolicies)
	}
	return nil
}
