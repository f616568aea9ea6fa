package holder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/elastic-training/elastic-training/internal/checkpoint"
)

// MaxConcurrent is how many requests the holder's server answers at once; more
// are answered 503 at once.
const MaxConcurrent = 64

// Handler serves
//
//	GET  /checkpoint/peer/{save}/{file}   a file of a piece this pod holds and has announced, to a peer (Range too)
//	GET  /checkpoint/newest               the newest complete save, as its rank 0's manifest (404: none)    trainer
//	GET  /checkpoint/files/{save}/{file}  a file of any held piece: from this pod, or through it from a peer  trainer
//	POST /checkpoint/saved                the trainer finished a save: look now                          trainer
//	POST /checkpoint/refused              a save of the trainer's did not fit (checkpoint.Incident)      trainer
//
// on one port, the trainer's routes to loopback only (pod networking, where the loopback is the pod's). Who reaches
// the peer route is the job's NetworkPolicy's to say (its pods only); what it serves is only the files of announced
// pieces, by name.
func (h *Holder) Handler() http.Handler {
	mux := http.NewServeMux()
	h.peerRoutes(mux)
	h.trainerRoutes(mux, loopback)
	return h.bounded(mux)
}

// PeerHandler serves the peer route alone, and LocalHandler the trainer's routes to whoever reaches it: host
// networking, where the loopback is the node's (every host-network pod's), serves the trainer's on a Unix socket in
// the pod's own volume (constants.CheckpointSocket) and the peers' on the job's own port.
func (h *Holder) PeerHandler() http.Handler {
	mux := http.NewServeMux()
	h.peerRoutes(mux)
	return h.bounded(mux)
}

// LocalHandler: see PeerHandler.
func (h *Holder) LocalHandler() http.Handler {
	mux := http.NewServeMux()
	h.trainerRoutes(mux, func(f http.HandlerFunc) http.HandlerFunc { return f })
	return h.bounded(mux)
}

func (h *Holder) peerRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /checkpoint/peer/{save}/{file}", h.servePeer)
}

func (h *Holder) trainerRoutes(mux *http.ServeMux, only func(http.HandlerFunc) http.HandlerFunc) {
	mux.HandleFunc("GET /checkpoint/newest", only(h.serveNewest))
	mux.HandleFunc("GET /checkpoint/files/{save}/{file}", only(h.serveFile))
	mux.HandleFunc("POST /checkpoint/saved", only(func(w http.ResponseWriter, _ *http.Request) {
		h.Wake()
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("POST /checkpoint/refused", only(h.serveRefused))
}

// bounded answers at most MaxConcurrent requests of the holder at once, whichever handler they reach.
func (h *Holder) bounded(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case h.sem <- struct{}{}:
			defer func() { <-h.sem }()
		default:
			http.Error(w, "busy: "+strconv.Itoa(MaxConcurrent)+" requests at once", http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Serve serves Handler at addr until ctx ends.
func (h *Holder) Serve(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return h.ServeListener(ctx, ln)
}

// ServeListener serves Handler on ln until ctx ends.
func (h *Holder) ServeListener(ctx context.Context, ln net.Listener) error {
	return h.ServeHandler(ctx, ln, h.Handler())
}

// ServeHandler serves one of the holder's handlers on ln until ctx ends.
func (h *Holder) ServeHandler(ctx context.Context, ln net.Listener, handler http.Handler) error {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 8 << 10,
		// A reader that stops reading holds its request's slot at most this long: 1 GiB at 2 MiB/s.
		WriteTimeout: 10 * time.Minute, IdleTimeout: time.Minute}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// serveRefused takes the trainer's word that a save did not fit (elastic_training.checkpoint, before it raises) and
// records it for an Event.
func (h *Holder) serveRefused(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(io.LimitReader(r.Body, 2<<10))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	in, err := checkpoint.ParseIncident(data)
	if err == nil && in.Kind != checkpoint.IncidentSave {
		err = fmt.Errorf("incident: kind %q, want %q", in.Kind, checkpoint.IncidentSave)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	in.Host, in.Memory = h.cfg.Self, h.cfg.Memory
	h.cfg.Log.Warn("checkpoint holder: the trainer's save does not fit in checkpoint.memory", "incident", in.Message())
	h.Report(r.Context(), in)
	w.WriteHeader(http.StatusNoContent)
}

func loopback(f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			http.Error(w, "only this pod's trainer may ask this", http.StatusForbidden)
			return
		}
		f(w, r)
	}
}

func (h *Holder) servePeer(w http.ResponseWriter, r *http.Request) {
	save, name := r.PathValue("save"), r.PathValue("file")
	h.mu.Lock()
	f, ok := h.localFile(save, name)
	announced := ok && h.announcedFile(save, name)
	h.mu.Unlock()
	if !announced {
		http.Error(w, "no such piece here", http.StatusNotFound)
		return
	}
	h.serveLocal(w, r, save, f)
}

// announcedFile: a piece this holder announced has the file. h.mu is held.
func (h *Holder) announcedFile(save, name string) bool {
	for p := range h.announced {
		if p.Save != save {
			continue
		}
		for _, f := range h.local[p].manifest.Files {
			if f.Name == name {
				return true
			}
		}
	}
	return false
}

func (h *Holder) serveLocal(w http.ResponseWriter, r *http.Request, save string, f checkpoint.File) {
	file, err := os.Open(filepath.Join(h.cfg.Dir, save, f.Name))
	if err != nil {
		http.Error(w, "gone: dropped a moment ago", http.StatusNotFound)
		return
	}
	defer file.Close()
	http.ServeContent(w, r, f.Name, time.Time{}, file)
}

func (h *Holder) serveNewest(w http.ResponseWriter, _ *http.Request) {
	members := h.cfg.Members()
	h.mu.Lock()
	// Among the members: the rounds that lead to a load begin when a lost pod leaves them, while its
	// announcements live on until their lease ends.
	m, ok := h.ix.NewestAmong(checkpoint.MemberOf(members))
	h.mu.Unlock()
	if !ok {
		http.Error(w, "no complete checkpoint in the job", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(m)
}

// serveFile serves a file of a save to the trainer: from this pod's directory
// when a piece here has it, else from a peer that holds it, passing the range on.
func (h *Holder) serveFile(w http.ResponseWriter, r *http.Request) {
	save, name := r.PathValue("save"), r.PathValue("file")
	if _, err := checkpoint.ParseSaveName(save); err != nil || checkpoint.ValidFileName(name) != nil {
		http.Error(w, "not a file of a save", http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	f, here := h.localFile(save, name)
	p, _, known := h.ix.File(save, name)
	holders := h.ix.Holders(p)
	h.mu.Unlock()
	if here {
		h.serveLocal(w, r, save, f)
		return
	}
	if !known {
		http.Error(w, "no pod of the job holds it", http.StatusNotFound)
		return
	}
	var last error
	for _, from := range preferMembers(holders, h.cfg.Members()) {
		if from == h.cfg.Self {
			continue
		}
		resp, err := h.get(r.Context(), r.Method, from, save, name, r.Header.Get("Range"))
		if err != nil {
			last = err
			continue
		}
		for _, k := range []string{"Content-Length", "Content-Range", "Content-Type"} {
			if v := resp.Header.Get(k); v != "" {
				w.Header().Set(k, v)
			}
		}
		w.WriteHeader(resp.StatusCode)
		if r.Method != http.MethodHead {
			io.Copy(w, resp.Body)
		}
		resp.Body.Close()
		return
	}
	msg := "no holder answered"
	if last != nil {
		msg += ": " + last.Error()
	}
	http.Error(w, msg, http.StatusBadGateway)
}
