package podcreation

import (
	"bufio"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The API server's metrics about one admission webhook (k8s.io/apiserver/pkg/admission/metrics): how often it
// called the webhook, and how long each call took as the API server saw it (connection, TLS, the webhook's
// handler and the answer), in a histogram whose buckets are 5 ms, 25 ms, 100 ms, 0.5 s, 1 s, 2.5 s, 10 s, 25 s.
const (
	metricWebhookCalls    = "apiserver_admission_webhook_request_total"
	metricWebhookDuration = "apiserver_admission_webhook_admission_duration_seconds"
)

// webhookMetrics is what the API server's /metrics says about one webhook's CREATE calls, summed over the other
// labels (rejected or not, response code).
type webhookMetrics struct {
	calls float64
	hist  histogram
}

// histogram is a Prometheus histogram: cumulative counts by upper bound (+Inf included), sum and count.
type histogram struct {
	buckets map[float64]float64
	sum     float64
	count   float64
}

// sub returns h - o, the observations made between two scrapes.
func (h histogram) sub(o histogram) histogram {
	d := histogram{buckets: map[float64]float64{}, sum: h.sum - o.sum, count: h.count - o.count}
	for le, n := range h.buckets {
		d.buckets[le] = n - o.buckets[le]
	}
	return d
}

func (h histogram) add(o histogram) histogram {
	d := histogram{buckets: map[float64]float64{}, sum: h.sum + o.sum, count: h.count + o.count}
	for le, n := range h.buckets {
		d.buckets[le] = n
	}
	for le, n := range o.buckets {
		d.buckets[le] += n
	}
	return d
}

func (h histogram) bounds() []float64 {
	les := make([]float64, 0, len(h.buckets))
	for le := range h.buckets {
		les = append(les, le)
	}
	sort.Float64s(les)
	return les
}

// quantile estimates the q-quantile as PromQL's histogram_quantile does: linear interpolation inside the bucket
// the rank falls in (from 0 for the first bucket), and the highest finite bound when it falls in +Inf. NaN
// without observations.
func (h histogram) quantile(q float64) float64 {
	les := h.bounds()
	if len(les) == 0 || h.buckets[math.Inf(1)] == 0 {
		return math.NaN()
	}
	rank := q * h.buckets[math.Inf(1)]
	lower, below := 0.0, 0.0
	for _, le := range les {
		n := h.buckets[le]
		if n >= rank {
			if math.IsInf(le, 1) {
				return lower
			}
			if n == below {
				return le
			}
			return lower + (le-lower)*(rank-below)/(n-below)
		}
		lower, below = le, n
	}
	return lower
}

// describe lists the observations per bucket ("<=5ms 498, <=25ms 2"), empty buckets left out.
func (h histogram) describe() string {
	var parts []string
	prev := 0.0
	for _, le := range h.bounds() {
		n := h.buckets[le] - prev
		prev = h.buckets[le]
		if n == 0 {
			continue
		}
		name := "<=" + msString(le)
		if math.IsInf(le, 1) {
			name = "more"
		}
		parts = append(parts, fmt.Sprintf("%s %.0f", name, n))
	}
	return strings.Join(parts, ", ")
}

func msString(s float64) string {
	return strconv.FormatFloat(s*1000, 'f', -1, 64) + "ms"
}

// parseWebhookMetrics reads the Prometheus text format of the API server's /metrics and keeps the CREATE calls
// of the webhook called name.
func parseWebhookMetrics(text, name string) (webhookMetrics, error) {
	m := webhookMetrics{hist: histogram{buckets: map[float64]float64{}}}
	s := bufio.NewScanner(strings.NewReader(text))
	s.Buffer(make([]byte, 0, 1<<20), 1<<24)
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, "apiserver_admission_webhook_") {
			continue
		}
		metric, labels, value, err := parseSample(line)
		if err != nil {
			return m, err
		}
		if labels["name"] != name || labels["operation"] != "CREATE" {
			continue
		}
		switch metric {
		case metricWebhookCalls:
			m.calls += value
		case metricWebhookDuration + "_bucket":
			le, err := strconv.ParseFloat(labels["le"], 64)
			if err != nil {
				return m, fmt.Errorf("%q: le: %w", line, err)
			}
			m.hist.buckets[le] += value
		case metricWebhookDuration + "_sum":
			m.hist.sum += value
		case metricWebhookDuration + "_count":
			m.hist.count += value
		}
	}
	return m, s.Err()
}

// parseSample splits `name{a="x",b="y"} 12 [timestamp]`.
func parseSample(line string) (name string, labels map[string]string, value float64, err error) {
	labels = map[string]string{}
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		name = line[:i]
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", nil, 0, fmt.Errorf("metrics line %q: no closing brace", line)
		}
		for body := line[i+1 : j]; body != ""; {
			k, after, ok := strings.Cut(body, `="`)
			if !ok {
				break
			}
			var v strings.Builder
			n := 0
			for ; n < len(after) && after[n] != '"'; n++ {
				if after[n] == '\\' && n+1 < len(after) {
					n++
				}
				v.WriteByte(after[n])
			}
			labels[strings.TrimSpace(strings.TrimPrefix(k, ","))] = v.String()
			if n+1 > len(after) {
				break
			}
			body = strings.TrimPrefix(after[n+1:], ",")
		}
		rest = line[j+1:]
	} else {
		name, rest, _ = strings.Cut(line, " ")
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", nil, 0, fmt.Errorf("metrics line %q: no value", line)
	}
	value, err = strconv.ParseFloat(f[0], 64)
	if err != nil {
		return "", nil, 0, fmt.Errorf("metrics line %q: %w", line, err)
	}
	return name, labels, value, nil
}

// Offline: the arithmetic the benchmark prints.

const sampleMetrics = `# HELP apiserver_admission_webhook_admission_duration_seconds [STABLE] Admission webhook latency histogram
# TYPE apiserver_admission_webhook_admission_duration_seconds histogram
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.elastic-training.io",operation="CREATE",rejected="false",type="admit",le="0.005"} 90
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.elastic-training.io",operation="CREATE",rejected="false",type="admit",le="0.025"} 99
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.elastic-training.io",operation="CREATE",rejected="false",type="admit",le="0.1"} 100
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.elastic-training.io",operation="CREATE",rejected="false",type="admit",le="+Inf"} 100
apiserver_admission_webhook_admission_duration_seconds_sum{name="pods.elastic-training.io",operation="CREATE",rejected="false",type="admit"} 0.3
apiserver_admission_webhook_admission_duration_seconds_count{name="pods.elastic-training.io",operation="CREATE",rejected="false",type="admit"} 100
apiserver_admission_webhook_admission_duration_seconds_bucket{name="other.example.com",operation="CREATE",rejected="false",type="admit",le="+Inf"} 7
apiserver_admission_webhook_request_total{code="200",name="pods.elastic-training.io",operation="CREATE",rejected="false",type="admit"} 100
apiserver_admission_webhook_request_total{code="400",name="pods.elastic-training.io",operation="CREATE",rejected="true",type="admit"} 2
apiserver_admission_webhook_request_total{code="200",name="other.example.com",operation="CREATE",rejected="false",type="admit"} 7
`

func TestParseWebhookMetrics(t *testing.T) {
	m, err := parseWebhookMetrics(sampleMetrics, "pods.elastic-training.io")
	if err != nil {
		t.Fatal(err)
	}
	if m.calls != 102 {
		t.Errorf("calls %v, want 102", m.calls)
	}
	if m.hist.count != 100 || m.hist.sum != 0.3 || m.hist.buckets[math.Inf(1)] != 100 || m.hist.buckets[0.025] != 99 {
		t.Errorf("histogram %+v", m.hist)
	}
	zero, _ := parseWebhookMetrics("", "pods.elastic-training.io")
	d := m.hist.sub(zero.hist)
	for q, want := range map[float64]float64{0.5: 0.005 * 50 / 90, 0.99: 0.025, 0.995: 0.025 + 0.075*0.5} {
		if got := d.quantile(q); math.Abs(got-want) > 1e-12 {
			t.Errorf("quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if got, want := d.describe(), "<=5ms 90, <=25ms 9, <=100ms 1"; got != want {
		t.Errorf("describe: %q, want %q", got, want)
	}
	if !math.IsNaN(zero.hist.quantile(0.5)) {
		t.Error("quantile of nothing is not NaN")
	}
}
