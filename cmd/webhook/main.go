// Command webhook is the elastic-training mutating admission webhook. It only
// parses flags and wires internal/webhook; see docs/contract.md for what it does
// to pods. Its Kubernetes API access: creating Events (--events), keeping its
// TLS Secret and webhook configuration's CA bundle (--cert-rotation-secret), and
// reviewing tokens and getting and deleting pods (--pod-replacement-url: a pod of
// a job, for that job's serving pod; internal/podreplace).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/elastic-training/elastic-training/internal/certrotation"
	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/podreplace"
	"github.com/elastic-training/elastic-training/internal/webhook"
)

// listFlag collects a repeatable, comma-separated flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// resourcesFlag is a container's resource requirements given as JSON, so
// that a cluster whose ResourceQuota counts limits.cpu can set one.
type resourcesFlag struct{ r *corev1.ResourceRequirements }

func (f resourcesFlag) String() string {
	if f.r == nil {
		return ""
	}
	b, _ := json.Marshal(f.r)
	return string(b)
}

func (f resourcesFlag) Set(s string) error {
	var r corev1.ResourceRequirements
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return fmt.Errorf("want a JSON object of requests and limits, e.g. {\"limits\":{\"cpu\":\"1\"}}: %w", err)
	}
	*f.r = r
	return nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "check" {
		os.Exit(checkCmd(os.Args[2:], os.Stdout, os.Stderr))
	}
	cfg := mutate.DefaultConfig()
	d := &cfg.Defaults
	var o webhook.Options
	var extra listFlag
	var pullPolicy string
	flag.StringVar(&o.Host, "host", "", "address the HTTPS admission server listens on (empty: all)")
	flag.IntVar(&o.Port, "port", 9443, "port of the HTTPS admission server")
	flag.StringVar(&o.CertDir, "cert-dir", "/etc/elastic-training-webhook/tls", "directory with tls.crt and tls.key (reloaded on change)")
	flag.StringVar(&o.HealthAddr, "health-addr", ":8081", "address of /healthz and /readyz")
	flag.StringVar(&o.MetricsAddr, "metrics-addr", ":8080", `address of /metrics ("0" disables)`)
	flag.BoolVar(&o.EnableHTTP2, "enable-http2", false, "offer HTTP/2 on the admission server (off: HTTP/1.1 only, as kubebuilder scaffolds, for CVE-2023-44487)")
	flag.StringVar(&cfg.SidecarImage, "sidecar-image", "", "rdzv-sidecar image injected into training pods (required)")
	flag.StringVar(&pullPolicy, "sidecar-image-pull-policy", "", "imagePullPolicy of the sidecar ("+strings.Join(constants.PullPolicies, ", ")+"; empty: Kubernetes' default)")
	flag.StringVar(&cfg.ClusterDomain, "cluster-domain", cfg.ClusterDomain, "cluster DNS domain")
	flag.StringVar(&cfg.WebhookNamespace, "webhook-namespace", "", "the webhook's own namespace, whose pods are never mutated")
	flag.StringVar(&cfg.Version, "version", "", "this webhook's release (its chart's version), named when a pod of a newer job chart is denied")
	flag.Var(&extra, "extra-accelerator", "extra resource name counted as an accelerator (repeatable or comma-separated)")
	flag.StringVar(&d.RdzvBackend, "default-rdzv-backend", d.RdzvBackend, "rendezvous backend when a pod does not say: "+strings.Join(constants.Backends, ", "))
	flag.IntVar(&d.JoinTimeout, "default-join-timeout", d.JoinTimeout, "seconds torchrun waits for min nodes")
	flag.IntVar(&d.LastCallTimeout, "default-last-call-timeout", d.LastCallTimeout, "seconds torchrun waits for more nodes once min is reached")
	flag.IntVar(&d.CloseTimeout, "default-close-timeout", d.CloseTimeout, "seconds torchrun waits for a closing rendezvous")
	flag.IntVar(&d.KeepAliveInterval, "default-keep-alive-interval", d.KeepAliveInterval, "seconds between rendezvous heartbeats (torch >= 2.3); a job of more than 32 × this many nodes gets max nodes / 32 (docs/scale.md)")
	flag.IntVar(&d.KeepAliveMaxAttempts, "default-keep-alive-max-attempts", d.KeepAliveMaxAttempts, "missed heartbeats before a node is dropped (torch >= 2.3)")
	flag.IntVar(&d.MaxRestarts, "default-max-restarts", d.MaxRestarts, "torchrun --max-restarts")
	flag.Float64Var(&d.MonitorInterval, "default-monitor-interval", d.MonitorInterval, "torchrun --monitor-interval in seconds for a job that sets none; a job of more than 4,096 × this many nodes gets max nodes / 4,096 (docs/scale.md)")
	flag.StringVar(&d.MPIFlavour, "default-mpi-flavour", d.MPIFlavour, "hostfile flavour: "+strings.Join(constants.MPIFlavours, ", "))
	flag.Var(resourcesFlag{&d.SidecarResources.Serve}, "sidecar-serve-resources", `resources of the sidecar that serves the rendezvous, as JSON (e.g. {"requests":{"cpu":"50m","memory":"64Mi"},"limits":{"cpu":"1","memory":"512Mi"}})`)
	flag.Var(resourcesFlag{&d.SidecarResources.Join}, "sidecar-join-resources", "resources of every other pod's sidecar, as JSON")
	var rot certrotation.Config
	var rotSecret string
	var rotNames listFlag
	flag.StringVar(&rotSecret, "cert-rotation-secret", "", "rotate the serving certificate in this process: the TLS Secret <namespace>/<name> that it keeps (with --cert-rotation-webhook and --cert-dns-names; needs the API and RBAC to update that Secret and the webhook configuration); empty: serve the certificate in --cert-dir as it is")
	flag.StringVar(&rot.WebhookConfiguration, "cert-rotation-webhook", "", "the MutatingWebhookConfiguration that gets the rotated CA bundle")
	flag.Var(&rotNames, "cert-dns-names", "DNS names of the serving certificate, the Service's first (repeatable or comma-separated)")
	flag.DurationVar(&rot.CAValidity, "ca-validity", 10*365*24*time.Hour, "validity of a rotated CA")
	flag.DurationVar(&rot.CertValidity, "cert-validity", 365*24*time.Hour, "validity of a rotated serving certificate")
	flag.DurationVar(&rot.Lookahead, "cert-lookahead", 90*24*time.Hour, "renew a certificate this long before it expires")
	flag.DurationVar(&rot.CheckInterval, "cert-check-interval", 12*time.Hour, "how often the certificates' expiry is checked")
	flag.StringVar(&cfg.PodReplacement.URL, "pod-replacement-url", "", "serve "+podreplace.Path+" and give serving sidecars this URL of it (https://<service>.<namespace>.svc:443"+podreplace.Path+"), with --cert-dir's ca.crt, to have a pod of their job replaced after repeated hangs (needs the API and RBAC to create tokenreviews and get and delete pods); empty: off")
	var events bool
	flag.BoolVar(&events, "events", false, "record denials and warnings as Events on the pods' Jobs and StatefulSets (needs the API: in-cluster config or --kubeconfig, and RBAC to create events)")
	zopts := zap.Options{}
	zopts.BindFlags(flag.CommandLine)
	flag.Parse()
	cfg.ExtraAccelerators = extra
	cfg.SidecarImagePullPolicy = corev1.PullPolicy(pullPolicy)

	log := zap.New(zap.UseFlagOptions(&zopts))
	ctrl.SetLogger(log)
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "webhook:", err)
		os.Exit(2)
	}
	o.Config = cfg
	o.Log = log
	// controller-runtime's own webhook metrics are in its registry: serve ours beside them.
	o.Metrics = metrics.Registry
	if events {
		stop, err := eventRecorder(&o)
		if err != nil {
			fmt.Fprintln(os.Stderr, "webhook: --events:", err)
			os.Exit(2)
		}
		defer stop()
	}
	if cfg.PodReplacement.URL != "" {
		h, err := replaceServer(o.Events, log, o.Metrics)
		if err != nil {
			fmt.Fprintln(os.Stderr, "webhook: --pod-replacement-url:", err)
			os.Exit(2)
		}
		o.Replace = h
	}
	ctx := ctrl.SetupSignalHandler()
	if rotSecret != "" {
		ns, name, _ := strings.Cut(rotSecret, "/")
		rot.Secret = types.NamespacedName{Namespace: ns, Name: name}
		if len(rotNames) > 0 {
			rot.DNSName, rot.ExtraDNSNames = rotNames[0], rotNames[1:]
		}
		rot.CertDir = o.CertDir
		if err := rotateCerts(ctx, rot, log); err != nil {
			log.Error(err, "certificate rotation")
			os.Exit(1)
		}
	}
	if err := webhook.Run(ctx, o); err != nil {
		log.Error(err, "webhook stopped")
		os.Exit(1)
	}
}

// rotateCerts starts the certificate rotation and returns once the serving certificate is in place, or fails; a
// rotation that stops later ends the process (its replica restarts and rotates again).
func rotateCerts(ctx context.Context, c certrotation.Config, log logr.Logger) error {
	rc, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	ready, failed, err := certrotation.Start(ctx, rc, c, log.WithName("cert-rotation"))
	if err != nil {
		return err
	}
	select {
	case <-ready:
	case err := <-failed:
		return fmt.Errorf("stopped before the certificate was ready: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	log.Info("serving certificate ready", "secret", c.Secret.String(), "dir", c.CertDir)
	go func() {
		if err := <-failed; err != nil {
			log.Error(err, "certificate rotation stopped")
			os.Exit(1)
		}
	}()
	return nil
}

// checkCmd is `webhook check`: the webhook chart's helm test (webhook.Check).
func checkCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg webhook.CheckConfig
	fs.StringVar(&cfg.URL, "url", "", "the admission server's https://<service>.<namespace>.svc:443/mutate-pods")
	fs.StringVar(&cfg.CAFile, "ca-file", "", "the CA of its serving certificate (the TLS Secret's ca.crt)")
	fs.DurationVar(&cfg.Timeout, "timeout", time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if cfg.URL == "" || cfg.CAFile == "" {
		fmt.Fprintln(stderr, "webhook check: --url and --ca-file are required")
		return 2
	}
	if err := webhook.Check(context.Background(), cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "webhook check:", err)
		return 1
	}
	return 0
}

// eventRecorder sets o.Events to a recorder that writes through the API
// server (controller-runtime's config: --kubeconfig, KUBECONFIG or in-cluster).
func eventRecorder(o *webhook.Options) (stop func(), err error) {
	rc, err := ctrl.GetConfig()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	o.Events = b.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "elastic-training-webhook"})
	return b.Shutdown, nil
}

// replaceServer serves pod replacements through the API server (controller-runtime's config, as eventRecorder).
func replaceServer(events record.EventRecorder, log logr.Logger, reg metrics.RegistererGatherer) (*podreplace.Server, error) {
	rc, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("the API server's config: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("a client of the API server: %w", err)
	}
	return podreplace.NewServer(podreplace.NewAPI(cs), log.WithName("replace"), reg, events)
}
