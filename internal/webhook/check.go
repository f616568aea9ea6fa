package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// CheckConfig is `webhook check`, the webhook chart's helm test: the
// admission server answers over TLS with a certificate of the CA the API
// server is given, and mutates a training pod as docs/contract.md says.
type CheckConfig struct {
	URL     string // https://<service>.<namespace>.svc:443/mutate-pods
	CAFile  string // the CA of the serving certificate (the TLS Secret's ca.crt)
	Timeout time.Duration
}

// Check sends an AdmissionReview of a training pod until the webhook answers
// or the timeout ends, and checks the answer: allowed, with a patch that adds
// the rdzv-sidecar and removes the chart's scheduling gate.
func Check(ctx context.Context, cfg CheckConfig, out io.Writer) error {
	ca, err := os.ReadFile(cfg.CAFile)
	if err != nil {
		return fmt.Errorf("the CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("the CA %s holds no PEM certificate", cfg.CAFile)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	pod := checkPod()
	raw, err := json.Marshal(pod)
	if err != nil {
		return err
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "helm-test", Operation: admissionv1.Create,
			Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: pod.Namespace, Object: runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	for {
		resp, err := post(ctx, client, cfg.URL, body)
		if err == nil {
			return checkResponse(resp, raw, out)
		}
		fmt.Fprintf(out, "webhook check: %v\n", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("the webhook at %s did not answer within %s: %w", cfg.URL, cfg.Timeout, err)
		case <-time.After(2 * time.Second):
		}
	}
}

func post(ctx context.Context, client *http.Client, url string, body []byte) (*admissionv1.AdmissionResponse, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %.200s", url, resp.Status, b)
	}
	var r admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &r); err != nil || r.Response == nil {
		return nil, fmt.Errorf("%s: not an AdmissionReview response: %.200s", url, b)
	}
	return r.Response, nil
}

func checkResponse(r *admissionv1.AdmissionResponse, raw []byte, out io.Writer) error {
	if !r.Allowed {
		msg := ""
		if r.Result != nil {
			msg = r.Result.Message
		}
		return fmt.Errorf("the webhook denied a training pod: %s", msg)
	}
	if r.PatchType == nil || *r.PatchType != admissionv1.PatchTypeJSONPatch || len(r.Patch) == 0 {
		return errors.New("the webhook allowed a training pod without a JSON patch: it did not mutate it")
	}
	p, err := jsonpatch.DecodePatch(r.Patch)
	if err != nil {
		return fmt.Errorf("the webhook's patch: %w", err)
	}
	b, err := p.Apply(raw)
	if err != nil {
		return fmt.Errorf("the webhook's patch does not apply: %w", err)
	}
	var pod corev1.Pod
	if err := json.Unmarshal(b, &pod); err != nil {
		return err
	}
	if !slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == constants.SidecarContainerName }) {
		return errors.New("the mutated pod has no rdzv-sidecar")
	}
	if len(pod.Spec.SchedulingGates) != 0 {
		return fmt.Errorf("the mutated pod keeps its scheduling gates %v", pod.Spec.SchedulingGates)
	}
	fmt.Fprintf(out, "OK: the webhook mutated a training pod (%s=%s, sidecar image %s, gate %s removed)\n",
		constants.AnnotationMutated, pod.Annotations[constants.AnnotationMutated], pod.Spec.InitContainers[0].Image, constants.SchedulingGate)
	return nil
}

// checkPod is a pod as the job chart renders it for a worker of a custom job.
func checkPod() *corev1.Pod {
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "helm-test-worker-1", Namespace: "elastic-training-helm-test",
			Labels: map[string]string{constants.LabelJob: "helm-test", constants.LabelRole: constants.RoleWorker, constants.LabelGroup: "worker"},
			Annotations: map[string]string{constants.AnnotationFramework: constants.FrameworkCustom,
				"batch.kubernetes.io/job-completion-index": "1"}},
		Spec: corev1.PodSpec{
			Hostname: "helm-test-worker-1", Subdomain: "helm-test",
			SchedulingGates: []corev1.PodSchedulingGate{{Name: constants.SchedulingGate}},
			Containers:      []corev1.Container{{Name: "trainer", Image: "helm-test"}},
		},
	}
}
