package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/podreplace"
	"github.com/elastic-training/elastic-training/internal/progress"
	"github.com/elastic-training/elastic-training/internal/torchview/jobevents"
)

// ReplaceConfig: a pod blamed for After hangs is replaced (docs/hangs.md): a restart of the round keeps a bad node
// or device in the job, a new pod may land elsewhere. The serving sidecar asks the webhook (internal/podreplace),
// which alone may delete a pod of the job.
type ReplaceConfig struct {
	After int    // hangs blamed on one pod before it is replaced; 0: never
	URL   string // the webhook's replacement URL; "": never
	CA    []byte // the CA of the webhook's serving certificate (PEM)
	// TokenFile holds this pod's token for the webhook (audience podreplace.Audience), kept fresh by the kubelet.
	TokenFile string
}

// replaceAsker is podreplace.Client's ask.
type replaceAsker func(context.Context, podreplace.Request) (podreplace.Response, error)

// replacer counts the hangs blamed on each pod and asks for a pod's replacement once it has After of them. Only
// what the verdict is sure of counts: ranks frozen whole (silent while others were heard) and ranks absent from
// their round; the least step alone is a hint, and in a job blocked in one collective it names every rank in turn.
type replacer struct {
	after   int
	ask     replaceAsker
	members func() []membership.Member
	warn    warner // nil: no Events
	log     *slog.Logger
	ctx     context.Context

	mu     sync.Mutex
	blamed map[string]int // pod name -> hangs blamed on it; a new pod has a new name
	asking bool           // an ask is in flight: a hang meanwhile is counted, not asked again
}

// newReplacer is nil when c does not replace (its hangs restart the round and nothing more).
func newReplacer(ctx context.Context, c ReplaceConfig, members func() []membership.Member, w warner, log *slog.Logger) (*replacer, error) {
	if c.After <= 0 || c.URL == "" {
		return nil, nil
	}
	cli, err := podreplace.NewClient(c.URL, c.CA, c.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("pod replacement: %w", err)
	}
	return &replacer{after: c.After, ask: cli.Replace, members: members, warn: w, log: log, ctx: ctx,
		blamed: map[string]int{}}, nil
}

// onHang counts the round's sure blames, one per pod, and asks for the first pod that has reached After.
func (r *replacer) onHang(run string, round int, v progress.Verdict) {
	pods := r.podsOf(v.Stopped)
	r.mu.Lock()
	defer r.mu.Unlock()
	var due string
	for _, p := range pods {
		r.blamed[p.name]++
		if r.blamed[p.name] >= r.after && due == "" {
			due = p.name
		}
	}
	r.forgetGone()
	if due == "" || r.asking {
		return
	}
	count := "a hang"
	if n := r.blamed[due]; n > 1 {
		count = fmt.Sprintf("%d hangs", n)
	}
	reason := fmt.Sprintf("%s blamed on it (the last: round %d of run %s, %s)", count, round, run, blameOf(v.Stopped, due, pods))
	r.asking = true
	go r.replace(due, reason)
}

// replace asks for pod's replacement; its count is forgotten once the webhook has deleted it, kept otherwise, so
// the next hang blamed on it asks again.
func (r *replacer) replace(pod, reason string) {
	resp, err := r.ask(r.ctx, podreplace.Request{Pod: pod, Reason: reason})
	r.mu.Lock()
	r.asking = false
	if err == nil {
		delete(r.blamed, pod)
	}
	r.mu.Unlock()
	if err != nil {
		r.log.Warn("pod not replaced", "pod", pod, "reason", reason, "err", err)
		if r.warn != nil {
			r.warn.Warning(jobevents.ReasonPodNotReplaced, fmt.Sprintf("Pod %s was not replaced after %s: %v", pod, reason, err))
		}
		return
	}
	r.log.Warn("pod replaced", "pod", pod, "node", resp.Node, "reason", reason, "webhook", resp.Message)
}

type blamedPod struct{ name, host string }

// podsOf maps the sure blames to their pods, once each, in the verdict's order. A member registered by an older
// sidecar has no pod name and cannot be named to the webhook.
func (r *replacer) podsOf(bs []progress.Blame) []blamedPod {
	byHost := map[string]string{}
	for _, m := range r.members() {
		byHost[m.Host] = m.Pod
	}
	var out []blamedPod
	seen := map[string]bool{}
	for _, b := range bs {
		if b.Silent <= 0 && !b.Absent {
			continue
		}
		pod := byHost[b.Host]
		if pod == "" || seen[pod] {
			continue
		}
		seen[pod] = true
		out = append(out, blamedPod{pod, b.Host})
	}
	return out
}

// forgetGone drops the counts of pods that are no longer members (deleted, lost, scaled away): the map stays as
// small as the job. Called with mu held.
func (r *replacer) forgetGone() {
	live := map[string]bool{}
	for _, m := range r.members() {
		live[m.Pod] = true
	}
	for p := range r.blamed {
		if !live[p] {
			delete(r.blamed, p)
		}
	}
}

// blameOf is how the verdict named pod's ranks.
func blameOf(bs []progress.Blame, pod string, pods []blamedPod) string {
	var host string
	for _, p := range pods {
		if p.name == pod {
			host = p.host
		}
	}
	var named []string
	for _, b := range bs {
		if b.Host == host {
			named = append(named, b.String())
		}
	}
	return strings.Join(named, "; ")
}
