// Package certrotation keeps the webhook's serving certificate current in the webhook process itself:
// open-policy-agent/cert-controller (as Gatekeeper and Kueue use it) generates a CA and a serving certificate into
// the TLS Secret, renews them before they expire and injects the CA into the MutatingWebhookConfiguration; this
// package adds only what that rotator leaves to its user: the Secret's certificate copied into the server's
// certificate directory as soon as the Secret changes, instead of when the kubelet next refreshes a Secret volume
// (up to a minute and more, during which a fresh install could not serve and a rotation served the old
// certificate).
package certrotation

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/elastic-training/elastic-training/internal/atomicfile"
	"github.com/elastic-training/elastic-training/internal/constants"
)

// Config says which Secret and webhook configuration the rotation keeps, for which Service, and how long
// certificates live.
type Config struct {
	// Secret holds ca.crt, ca.key, tls.crt and tls.key (type kubernetes.io/tls); it must exist (the chart creates
	// it empty): the rotator fills it.
	Secret types.NamespacedName
	// WebhookConfiguration is the MutatingWebhookConfiguration whose webhooks get the CA bundle.
	WebhookConfiguration string
	// DNSName and ExtraDNSNames are the serving certificate's names (the Service's).
	DNSName       string
	ExtraDNSNames []string
	// CertDir is where tls.crt and tls.key are written for the server (an emptyDir).
	CertDir string
	// CAValidity, CertValidity: how long a CA and a serving certificate are valid; Lookahead: how long before its
	// end a certificate is renewed; CheckInterval: how often that is checked. Zero: cert-controller's defaults
	// (10 years, 1 year, 90 days, 12 hours).
	CAValidity, CertValidity, Lookahead, CheckInterval time.Duration
}

// Validate says what is wrong with c, naming the flag a user sets.
func (c Config) Validate() error {
	switch {
	case c.Secret.Namespace == "" || c.Secret.Name == "":
		return fmt.Errorf("the TLS Secret's namespace and name are required")
	case c.WebhookConfiguration == "":
		return fmt.Errorf("the MutatingWebhookConfiguration's name is required")
	case c.DNSName == "":
		return fmt.Errorf("the serving certificate's DNS name is required")
	case c.CertDir == "":
		return fmt.Errorf("the certificate directory is required")
	case c.CertValidity != 0 && c.Lookahead >= c.CertValidity:
		return fmt.Errorf("lookahead %s must be shorter than the certificate's validity %s (it would be renewed at once, for ever)", c.Lookahead, c.CertValidity)
	case c.CAValidity != 0 && c.CertValidity > c.CAValidity:
		return fmt.Errorf("a certificate's validity %s cannot outlast its CA's %s", c.CertValidity, c.CAValidity)
	}
	return nil
}

// Start runs the rotation until ctx is done and returns a channel closed once tls.crt and tls.key are in CertDir
// and the CA is in the webhook configuration (then the server can start), and one that carries the error that
// stopped the rotation.
func Start(ctx context.Context, rc *rest.Config, c Config, log logr.Logger) (ready <-chan struct{}, failed <-chan error, err error) {
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, nil, err
	}
	mgr, err := manager.New(rc, manager.Options{
		Scheme:                 scheme,
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// One Secret is all this manager's own cache watches (the rotator brings its own).
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{&corev1.Secret{}: {
			Namespaces: map[string]cache.Config{c.Secret.Namespace: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", c.Secret.Name),
		}}},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("certificate rotation: %w", err)
	}
	isReady := make(chan struct{})
	if err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:              c.Secret,
		CertDir:                c.CertDir,
		CAName:                 c.DNSName + "-ca",
		CAOrganization:         "elastic-training",
		DNSName:                c.DNSName,
		ExtraDNSNames:          c.ExtraDNSNames,
		IsReady:                isReady,
		Webhooks:               []rotator.WebhookInfo{{Name: c.WebhookConfiguration, Type: rotator.Mutating}},
		FieldOwner:             "elastic-training-webhook",
		CaCertDuration:         c.CAValidity,
		ServerCertDuration:     c.CertValidity,
		LookaheadInterval:      c.Lookahead,
		RotationCheckFrequency: c.CheckInterval,
		// Every replica rotates: the Secret's resourceVersion makes one write win, and the others read it.
		RequireLeaderElection: false,
	}); err != nil {
		return nil, nil, fmt.Errorf("certificate rotation: %w", err)
	}
	inf, err := mgr.GetCache().GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return nil, nil, fmt.Errorf("certificate rotation: watch Secret %s: %w", c.Secret, err)
	}
	copyOut := func(obj any) {
		s, ok := obj.(*corev1.Secret)
		if !ok || s.Name != c.Secret.Name {
			return
		}
		if err := WriteCerts(c.CertDir, s.Data); err != nil {
			log.Error(err, "write the serving certificate", "dir", c.CertDir)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    copyOut,
		UpdateFunc: func(_, obj any) { copyOut(obj) },
	}); err != nil {
		return nil, nil, err
	}
	errs := make(chan error, 1)
	go func() { errs <- mgr.Start(ctx) }()
	return isReady, errs, nil
}

// WriteCerts writes the Secret data's tls.key, tls.crt and ca.crt into dir (key first: a server that reads the pair between
// the two writes keeps its old one), each atomically and only when it changed; data without both writes nothing (a Secret the
// rotator has not filled yet).
func WriteCerts(dir string, data map[string][]byte) error {
	crt, key := data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey]
	if len(crt) == 0 || len(key) == 0 {
		return nil
	}
	if _, err := atomicfile.Write(dir, corev1.TLSPrivateKeyKey, key, 0o600); err != nil {
		return err
	}
	if _, err := atomicfile.Write(dir, corev1.TLSCertKey, crt, 0o644); err != nil {
		return err
	}
	// The CA (never its key): what serving sidecars get to trust the webhook when they ask for a pod's replacement
	// (internal/podreplace); the chart's and cert-manager's Secrets mount it beside the pair.
	if ca := data[constants.TLSCAName]; len(ca) > 0 {
		if _, err := atomicfile.Write(dir, constants.TLSCAName, ca, 0o644); err != nil {
			return err
		}
	}
	return nil
}
