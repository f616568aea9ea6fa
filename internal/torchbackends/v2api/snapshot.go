package v2api

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/v2error"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
)

// snapshot is what Snapshot writes: the store as etcd saves it, plus the
// directory TTLs this front end keeps.
type snapshot struct {
	Store json.RawMessage          `json:"store"`
	Dirs  map[string]dirTTLPersist `json:"dirs,omitempty"`
}

type dirTTLPersist struct {
	TTL          time.Duration `json:"ttl"`
	Deadline     time.Time     `json:"deadline"`
	LastWrite    time.Time     `json:"lastWrite"`
	CreatedIndex uint64        `json:"createdIndex"`
}

// Snapshot serialises the keys, their TTLs and the index, so that a serve
// restarted after a graceful shutdown continues where it stopped (torch
// agents then keep their rendezvous instead of starting over).
func (s *Server) Snapshot() ([]byte, error) {
	raw, err := s.store.Save()
	if err != nil {
		return nil, fmt.Errorf("snapshot v2 store: %w", err)
	}
	if raw, err = s.forgetDeleted(raw); err != nil {
		return nil, fmt.Errorf("snapshot v2 store: %w", err)
	}
	snap := snapshot{Store: raw, Dirs: map[string]dirTTLPersist{}}
	s.dirs.mu.Lock()
	for p, e := range s.dirs.dirs {
		snap.Dirs[p] = dirTTLPersist{TTL: e.ttl, Deadline: e.deadline, LastWrite: e.lastWrite, CreatedIndex: e.createdIndex}
	}
	s.dirs.mu.Unlock()
	return json.Marshal(snap)
}

// forgetDeleted drops from etcd's saved store the values its event history
// keeps of keys that no longer exist: a value deleted (or expired) must not
// outlive the process on disk. The events stay, so a watcher that resumes
// after a restart still sees what happened.
func (s *Server) forgetDeleted(raw []byte) ([]byte, error) {
	var saved map[string]json.RawMessage
	if err := json.Unmarshal(raw, &saved); err != nil {
		return nil, err
	}
	var hub struct {
		EventHistory *struct {
			Queue struct {
				Events                      []*v2store.Event
				Size, Front, Back, Capacity int
			}
			StartIndex, LastIndex uint64
		}
	}
	if err := json.Unmarshal(saved["WatcherHub"], &hub); err != nil || hub.EventHistory == nil {
		return raw, err
	}
	gone := func(n *v2store.NodeExtern) {
		if n == nil || n.Value == nil {
			return
		}
		if _, err := s.store.Get(n.Key, false, false); err != nil {
			n.Value = nil
		}
	}
	for _, ev := range hub.EventHistory.Queue.Events {
		if ev != nil {
			gone(ev.Node)
			gone(ev.PrevNode)
		}
	}
	var err error
	if saved["WatcherHub"], err = json.Marshal(hub); err != nil {
		return nil, err
	}
	return json.Marshal(saved)
}

// Restore loads a Snapshot; call it before serving.
func (s *Server) Restore(data []byte) error {
	var snap snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return fmt.Errorf("restore v2 store: %w", err)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.store.Recovery(snap.Store); err != nil {
		return fmt.Errorf("restore v2 store: %w", err)
	}
	s.quota.rebuild(s.store)
	s.dirs.mu.Lock()
	defer s.dirs.mu.Unlock()
	for p, e := range snap.Dirs {
		s.dirs.dirs[p] = &dirTTL{ttl: e.TTL, deadline: e.Deadline, lastWrite: e.LastWrite, createdIndex: e.CreatedIndex}
	}
	return nil
}

// EnsureDir creates the permanent directory key (as clients name it) unless
// it exists.
func (s *Server) EnsureDir(key string) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	ev, err := s.store.Create(path.Join(storeKeysPrefix, key), true, "", false, v2store.TTLOptionSet{})
	if err == nil {
		s.quota.written(ev.Node.Key, true, "", time.Time{}, false, ev.EtcdIndex)
	}
	var e *v2error.Error
	if errors.As(err, &e) && e.ErrorCode == v2error.EcodeNodeExist {
		return nil
	}
	return err
}

// Value is the value of key (as clients name it), for observers in the same
// process; false for a missing key or a directory.
func (s *Server) Value(key string) (string, bool) {
	ev, err := s.store.Get(path.Join(storeKeysPrefix, key), false, false)
	if err != nil || ev.Node == nil || ev.Node.Value == nil {
		return "", false
	}
	return *ev.Node.Value, true
}
