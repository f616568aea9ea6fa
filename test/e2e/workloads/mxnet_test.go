package workloads

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

var dmlcLine = regexp.MustCompile(`(?m)^dmlc (.*)$`)

// TestMXNetParameterServer is the MXNet case: scheduler, servers and workers start with one consistent DMLC_*
// contract. Each pod prints the values it got; the scheduler (examples/scripts/dmlc_roles.py) releases the job
// only when the servers and workers that registered with it over the network match the counts it was given,
// and the test checks every pod's values against the chart's settings.
func TestMXNetParameterServer(t *testing.T) {
	c := framework.Get(t)
	installWebhook(t, c)
	ns := c.Namespace(t)
	const job, servers, workers, port = "ps", 2, 3, 9091
	c.HelmInstall(t, ns, job, c.RepoPath(jobChart), jobValues(t, c, "examples/local/mxnet-ps.yaml", "examples/scripts/dmlc_roles.py"))

	waitJobComplete(t, c, ns, naming.Workload(job, constants.GroupWorker), 3*time.Minute)
	sched := job + "-scheduler-0"
	c.WaitForLog(t, ns, sched, trainer, fmt.Sprintf("all registered servers=%d workers=%d worker_ids=[0, 1, 2]", servers, workers), time.Minute)

	want := map[string]string{
		"DMLC_PS_ROOT_URI":  naming.PodFQDN(sched, naming.HeadlessService(job), ns, framework.ClusterDomain),
		"DMLC_PS_ROOT_PORT": fmt.Sprint(port),
		"DMLC_NUM_SERVER":   fmt.Sprint(servers),
		"DMLC_NUM_WORKER":   fmt.Sprint(workers),
	}
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: constants.LabelJob + "=" + job})
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]int{}
	var ids []string
	for _, p := range pods.Items {
		role := p.Labels[constants.LabelRole]
		m := dmlcLine.FindStringSubmatch(c.PodLogs(t, ns, p.Name, trainer))
		if m == nil {
			t.Errorf("%s (%s) printed no dmlc line", p.Name, role)
			continue
		}
		got := map[string]string{}
		for _, kv := range strings.Fields(m[1]) {
			k, v, _ := strings.Cut(kv, "=")
			got[k] = v
		}
		roles[got["DMLC_ROLE"]]++
		if got["DMLC_ROLE"] != role {
			t.Errorf("%s: DMLC_ROLE=%q, want its role label %q", p.Name, got["DMLC_ROLE"], role)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s (%s): %s=%q, want %q", p.Name, role, k, got[k], v)
			}
		}
		if role == constants.RoleWorker {
			ids = append(ids, got["DMLC_WORKER_ID"])
		}
	}
	sort.Strings(ids)
	if fmt.Sprint(roles) != fmt.Sprintf("map[scheduler:1 server:%d worker:%d]", servers, workers) || fmt.Sprint(ids) != "[0 1 2]" {
		t.Errorf("roles %v, worker ids %v; want 1 scheduler, %d servers, %d workers with ids 0..2", roles, ids, servers, workers)
	}

	c.HelmUninstall(t, ns, job, 2*time.Minute)
	waitEmpty(t, c, ns)
}
