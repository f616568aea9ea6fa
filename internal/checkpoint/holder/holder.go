// Package holder is a sidecar's half of the job's in-memory checkpoints
// (docs/checkpoints.md): it announces in the job's store the pieces of saves
// in its pod's checkpoint directory (its trainer's, and copies), follows what
// every pod announces (checkpoint.Index), fetches the copies checkpoint.Plan
// gives it from the peers that hold them, drops what is no longer needed, and
// serves its pieces to peers and the job's checkpoints to its own trainer
// (http.go).
package holder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/checkpoint"
)

// Config is one pod's holder.
type Config struct {
	Dir      string // the checkpoint directory the trainer saves into (memory-backed, shared with it)
	Self     string // this pod's member host
	Replicas int    // copies of each piece on other pods
	Memory   int64  // bytes the directory may hold: the trainer's saves and the copies
	Client   *clientv3.Client
	Prefix   string // the announcements' key prefix (constants.CheckpointsPrefix)
	// IncidentKey is where this pod's last Incident (a save or a copy that did not fit) is written, under the
	// holder's lease; the serving sidecar makes each a Warning Event. Empty: not written.
	IncidentKey string
	// Members are the job's members as last listed (the pods that hold pieces, and their nodes).
	Members  func() []checkpoint.Holder
	PeerPort int           // where every pod's holder serves its peers (constants.CheckpointPort)
	TTL      time.Duration // of the announcements' lease: a pod lost with its node is forgotten after this
	Tick     time.Duration // how often the directory is looked at without being told (POST /checkpoint/saved)
	Log      *slog.Logger
	HTTP     *http.Client // to fetch from peers; nil: one with connect and header timeouts
}

// Defaults.
const (
	DefaultTTL  = 10 * time.Second
	DefaultTick = time.Second
)

// Holder runs one pod's part.
type Holder struct {
	cfg  Config
	wake chan struct{}
	sem  chan struct{} // the requests being answered (MaxConcurrent)

	mu        sync.Mutex
	ix        *checkpoint.Index
	local     map[checkpoint.Piece]local // in the directory at the last look
	announced map[checkpoint.Piece]bool  // by this holder under its current lease
	refused   map[checkpoint.Piece]bool  // copies that did not fit, logged once
	lease     clientv3.LeaseID           // the current session's; 0 between sessions
}

// New returns a holder; Run starts it.
func New(cfg Config) *Holder {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Tick == 0 {
		cfg.Tick = DefaultTick
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
			ResponseHeaderTimeout: 10 * time.Second,
			MaxIdleConnsPerHost:   4,
		}}
	}
	return &Holder{cfg: cfg, wake: make(chan struct{}, 1), sem: make(chan struct{}, MaxConcurrent), ix: checkpoint.NewIndex(),
		local: map[checkpoint.Piece]local{}, announced: map[checkpoint.Piece]bool{}, refused: map[checkpoint.Piece]bool{}}
}

// Wake makes the holder look at its directory now (the trainer finished a save).
func (h *Holder) Wake() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Run announces, follows, fetches and drops until ctx ends; then its
// announcements are withdrawn (its lease revoked).
func (h *Holder) Run(ctx context.Context) error {
	if err := os.MkdirAll(h.cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("checkpoint directory: %w", err)
	}
	for ctx.Err() == nil {
		if err := h.session(ctx); err != nil && ctx.Err() == nil {
			h.cfg.Log.Warn("checkpoint holder: the job's store failed; again in a second", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// session runs under one lease, until the lease or the watch ends.
func (h *Holder) session(ctx context.Context) error {
	cli := h.cfg.Client
	lease, err := cli.Grant(ctx, int64(h.cfg.TTL/time.Second))
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		cli.Revoke(rctx, lease.ID)
	}()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	alive, err := cli.KeepAlive(sctx, lease.ID)
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	h.mu.Lock()
	h.lease = lease.ID
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.lease = 0
		h.mu.Unlock()
	}()
	resp, err := cli.Get(sctx, h.cfg.Prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("announcements: %w", err)
	}
	h.mu.Lock()
	h.ix, h.announced = checkpoint.NewIndex(), map[checkpoint.Piece]bool{}
	for _, kv := range resp.Kvs {
		h.apply(string(kv.Key), kv.Value)
	}
	h.mu.Unlock()
	watch := cli.Watch(sctx, h.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	tick := time.NewTicker(h.cfg.Tick)
	defer tick.Stop()
	for {
		h.pass(sctx, lease.ID)
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-alive:
			if !ok {
				return errors.New("lease lost")
			}
			continue // no pass: keep-alives come every few seconds and change nothing
		case wr, ok := <-watch:
			if !ok || wr.Err() != nil {
				return fmt.Errorf("watch: %v", wr.Err())
			}
			h.mu.Lock()
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					h.apply(string(ev.Kv.Key), nil)
				} else {
					h.apply(string(ev.Kv.Key), ev.Kv.Value)
				}
			}
			h.mu.Unlock()
		case <-h.wake:
		case <-tick.C:
		}
	}
}

// announcement is the value under <prefix><save>/<rank>/<holder>.
type announcement struct {
	Origin   bool                `json:"origin"`
	Manifest checkpoint.Manifest `json:"manifest"`
}

func (h *Holder) key(p checkpoint.Piece, holder string) string {
	return h.cfg.Prefix + p.Save + "/" + strconv.Itoa(p.Rank) + "/" + holder
}

// parseAnnouncement checks a key and its value as any pod of the job may have
// written them: a key that names another piece than its value, or a value that
// does not parse, is refused.
func parseAnnouncement(prefix, key string, value []byte) (checkpoint.Piece, string, *announcement, error) {
	parts := strings.Split(strings.TrimPrefix(key, prefix), "/")
	if !strings.HasPrefix(key, prefix) || len(parts) != 3 || parts[2] == "" {
		return checkpoint.Piece{}, "", nil, fmt.Errorf("announcement %.120q: not <save>/<rank>/<holder>", key)
	}
	rank, err := strconv.Atoi(parts[1])
	if _, serr := checkpoint.ParseSaveName(parts[0]); err != nil || serr != nil || rank < 0 || strconv.Itoa(rank) != parts[1] {
		return checkpoint.Piece{}, "", nil, fmt.Errorf("announcement %.120q: not <save>/<rank>/<holder>", key)
	}
	p, holder := checkpoint.Piece{Save: parts[0], Rank: rank}, parts[2]
	if value == nil {
		return p, holder, nil, nil
	}
	if len(value) > 1<<20 {
		return p, holder, nil, fmt.Errorf("announcement %s by %s: %d bytes", p, holder, len(value))
	}
	var a announcement
	dec := json.NewDecoder(strings.NewReader(string(value)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return p, holder, nil, fmt.Errorf("announcement %s by %s: %w", p, holder, err)
	}
	if err := a.Manifest.Validate(); err != nil {
		return p, holder, nil, fmt.Errorf("announcement %s by %s: %w", p, holder, err)
	}
	if a.Manifest.Save != p.Save || a.Manifest.Rank != p.Rank {
		return p, holder, nil, fmt.Errorf("announcement %s by %s: its manifest is of %s rank %d", p, holder, a.Manifest.Save, a.Manifest.Rank)
	}
	for _, f := range a.Manifest.Files {
		if f.SHA256 == "" {
			return p, holder, nil, fmt.Errorf("announcement %s by %s: %s has no checksum", p, holder, f.Name)
		}
	}
	return p, holder, &a, nil
}

// apply takes one announcement (value nil: withdrawn). h.mu is held.
func (h *Holder) apply(key string, value []byte) {
	p, holder, a, err := parseAnnouncement(h.cfg.Prefix, key, value)
	switch {
	case err != nil:
		h.cfg.Log.Warn("checkpoint holder: refused an announcement", "err", err)
	case a == nil:
		h.ix.Forget(holder, p)
	default:
		if err := h.ix.Announce(holder, a.Origin, a.Manifest); err != nil {
			h.cfg.Log.Warn("checkpoint holder: refused an announcement", "holder", holder, "err", err)
		}
	}
}

// pass looks at the directory, announces what is new there, withdraws what is
// gone, and carries out the plan.
func (h *Holder) pass(ctx context.Context, lease clientv3.LeaseID) {
	saves, pieces, bad, err := scan(h.cfg.Dir)
	if err != nil {
		h.cfg.Log.Error("checkpoint holder", "err", err)
		return
	}
	for _, err := range bad {
		h.cfg.Log.Warn("checkpoint holder: a piece in the directory is not usable", "err", err)
	}
	now := map[checkpoint.Piece]local{}
	for _, l := range pieces {
		now[checkpoint.Piece{Save: l.manifest.Save, Rank: l.manifest.Rank}] = l
	}
	h.mu.Lock()
	h.local = now
	var toAnnounce []checkpoint.Piece
	for p := range now {
		if !h.announced[p] {
			toAnnounce = append(toAnnounce, p)
		}
	}
	var gone []checkpoint.Piece
	for p := range h.announced {
		if _, ok := now[p]; !ok {
			gone = append(gone, p)
		}
	}
	h.mu.Unlock()
	for _, p := range gone {
		if _, err := h.cfg.Client.Delete(ctx, h.key(p, h.cfg.Self)); err != nil {
			return
		}
		h.mu.Lock()
		delete(h.announced, p)
		h.mu.Unlock()
	}
	slices.SortFunc(toAnnounce, func(a, b checkpoint.Piece) int { return strings.Compare(a.String(), b.String()) })
	for _, p := range toAnnounce {
		l := now[p]
		m := l.manifest
		if l.origin {
			if m, err = checksum(h.cfg.Dir, m); err != nil {
				h.cfg.Log.Error("checkpoint holder: the trainer's save is not what its manifest says", "err", err)
				continue
			}
		}
		// Served before it is announced: a peer may ask the moment the announcement is in the store.
		h.mu.Lock()
		h.announced[p] = true
		h.local[p] = local{manifest: m, origin: l.origin}
		h.mu.Unlock()
		value, _ := json.Marshal(announcement{Origin: l.origin, Manifest: m})
		if _, err := h.cfg.Client.Put(ctx, h.key(p, h.cfg.Self), string(value), clientv3.WithLease(lease)); err != nil {
			h.mu.Lock()
			delete(h.announced, p)
			h.mu.Unlock()
			return
		}
		h.mu.Lock()
		// Now, not when the watch brings it back: the plan must not give this holder what it holds.
		if err := h.ix.Announce(h.cfg.Self, l.origin, m); err != nil {
			h.cfg.Log.Warn("checkpoint holder: its own piece is refused", "err", err)
		}
		h.mu.Unlock()
		if l.origin {
			h.cfg.Log.Info("checkpoint saved", "save", m.Save, "step", m.Step, "rank", m.Rank, "bytes", m.Bytes())
		}
	}
	h.mu.Lock()
	members := h.cfg.Members()
	plan := h.ix.Plan(h.cfg.Self, members, h.cfg.Replicas, saves)
	h.mu.Unlock()
	for _, save := range plan.Drop {
		if err := os.RemoveAll(filepath.Join(h.cfg.Dir, save)); err != nil {
			h.cfg.Log.Warn("checkpoint holder: dropping a save", "save", save, "err", err)
		}
	}
	if len(plan.Drop) > 0 {
		h.cfg.Log.Debug("checkpoint holder: dropped older saves", "saves", strings.Join(plan.Drop, ","))
		h.Wake() // withdraw them at once
	}
	for _, p := range plan.Fetch {
		if ctx.Err() != nil {
			return
		}
		if err := h.fetch(ctx, p, members); err != nil {
			h.cfg.Log.Warn("checkpoint holder: fetching a copy failed", "piece", p.String(), "err", err)
			continue
		}
		h.Wake()
	}
}

// fetch copies p from one of its holders, if it fits.
func (h *Holder) fetch(ctx context.Context, p checkpoint.Piece, members []checkpoint.Holder) error {
	h.mu.Lock()
	m, ok := h.ix.Manifest(p)
	holders := h.ix.Holders(p)
	reserve := h.reserve()
	h.mu.Unlock()
	if !ok {
		return nil
	}
	used, err := usage(h.cfg.Dir)
	if err != nil {
		return err
	}
	if used+m.Bytes()+reserve > h.cfg.Memory {
		h.mu.Lock()
		first := !h.refused[p]
		h.refused[p] = true
		h.mu.Unlock()
		if first {
			h.cfg.Log.Warn("checkpoint holder: a copy does not fit in checkpoint.memory; it stays where it is",
				"piece", p.String(), "bytes", m.Bytes(), "used", used, "reserved_for_the_next_save", reserve, "memory", h.cfg.Memory)
			h.Report(ctx, checkpoint.Incident{Kind: checkpoint.IncidentCopy, Step: m.Step, Rank: p.Rank, Need: m.Bytes(),
				Free: max(0, h.cfg.Memory-used-reserve)})
		}
		return nil
	}
	dir := filepath.Join(h.cfg.Dir, p.Save)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, from := range preferMembers(holders, members) {
		if from == h.cfg.Self {
			continue
		}
		err := h.fetchFrom(ctx, from, dir, m)
		if err == nil {
			data, _ := json.Marshal(m)
			name := fmt.Sprintf("copy-%d.json", p.Rank)
			if err := os.WriteFile(filepath.Join(dir, "."+name), data, 0o644); err != nil {
				return err
			}
			if err := os.Rename(filepath.Join(dir, "."+name), filepath.Join(dir, name)); err != nil {
				return err
			}
			h.cfg.Log.Info("checkpoint copy fetched", "piece", p.String(), "from", from, "bytes", m.Bytes())
			return nil
		}
		errs = append(errs, fmt.Errorf("from %s: %w", from, err))
	}
	// What was fetched of it is of no use: the piece counts only with every file.
	for _, f := range m.Files {
		if !h.hasFile(p.Save, f.Name) {
			os.Remove(filepath.Join(dir, f.Name))
		}
	}
	return errors.Join(errs...)
}

// Report writes in as this pod's last incident (IncidentKey, under the holder's lease, so that it goes with the
// pod), for the serving sidecar to make it an Event; it fills in the pod and its memory.
func (h *Holder) Report(ctx context.Context, in checkpoint.Incident) {
	if h.cfg.IncidentKey == "" {
		return
	}
	in.Host, in.Memory = h.cfg.Self, h.cfg.Memory
	h.mu.Lock()
	lease := h.lease
	h.mu.Unlock()
	var opts []clientv3.OpOption
	if lease != 0 {
		opts = append(opts, clientv3.WithLease(lease))
	}
	value, _ := json.Marshal(in)
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := h.cfg.Client.Put(pctx, h.cfg.IncidentKey, string(value), opts...); err != nil {
		h.cfg.Log.Warn("checkpoint holder: recording an incident", "incident", in.Message(), "err", err)
	}
}

// reserve is room for the trainer's next save: the size of its newest. h.mu is held.
func (h *Holder) reserve() int64 {
	bySave := map[string]int64{}
	newest := ""
	for p, l := range h.local {
		if l.origin {
			bySave[p.Save] += l.manifest.Bytes()
			if p.Save > newest {
				newest = p.Save
			}
		}
	}
	return bySave[newest]
}

// hasFile: a piece in the directory (complete, with its manifest) has the file.
func (h *Holder) hasFile(save, name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.localFile(save, name)
	return ok
}

// localFile is the file of a piece in the directory. h.mu is held.
func (h *Holder) localFile(save, name string) (checkpoint.File, bool) {
	for p, l := range h.local {
		if p.Save != save {
			continue
		}
		for _, f := range l.manifest.Files {
			if f.Name == name {
				return f, true
			}
		}
	}
	return checkpoint.File{}, false
}

func (h *Holder) fetchFrom(ctx context.Context, from, dir string, m checkpoint.Manifest) error {
	for _, f := range m.Files {
		if h.hasFile(m.Save, f.Name) {
			continue // .metadata of a save whose rank 0 this pod holds already, say
		}
		resp, err := h.get(ctx, http.MethodGet, from, m.Save, f.Name, "")
		if err != nil {
			return err
		}
		err = writeChecked(dir, f.Name, resp.Body, f.Size, f.SHA256)
		resp.Body.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// get asks a peer's holder for a file of a save (method GET or HEAD; rng: an HTTP Range, or "").
func (h *Holder) get(ctx context.Context, method, from, save, name, rng string) (*http.Response, error) {
	u := "http://" + net.JoinHostPort(from, strconv.Itoa(h.cfg.PeerPort)) + "/checkpoint/peer/" + save + "/" + name
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := h.cfg.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s: %s", u, resp.Status, strings.TrimSpace(string(body)))
	}
	return resp, nil
}

// preferMembers orders holders: members first (a holder that is no longer a
// member is likely lost with its node; its announcements end with its lease).
func preferMembers(holders []string, members []checkpoint.Holder) []string {
	isMember := map[string]bool{}
	for _, m := range members {
		isMember[m.Host] = true
	}
	out := slices.Clone(holders)
	slices.SortStableFunc(out, func(a, b string) int {
		switch {
		case isMember[a] == isMember[b]:
			return 0
		case isMember[a]:
			return -1
		}
		return 1
	})
	return out
}
