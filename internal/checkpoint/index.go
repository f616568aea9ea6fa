package checkpoint

import (
	"fmt"
	"slices"
	"sort"
)

// Piece names one rank's part of one save.
type Piece struct {
	Save string
	Rank int
}

func (p Piece) String() string { return fmt.Sprintf("%s rank %d", p.Save, p.Rank) }

// Index is who holds which piece, as the holders announce it in the job's
// store. Not safe for concurrent use.
type Index struct {
	saves map[string]*saveIndex
}

type saveIndex struct {
	step    int64
	world   int
	pieces  map[int]*pieceIndex
	created int // order of first announcement: ties of step go to the later save
}

type pieceIndex struct {
	manifest Manifest
	holders  map[string]bool // host -> origin (the pod whose trainer wrote it)
}

// NewIndex returns an empty index.
func NewIndex() *Index { return &Index{saves: map[string]*saveIndex{}} }

// Announce records that holder holds m's piece (origin: its own trainer wrote
// it). A piece whose files differ from those another holder announced, or a
// save whose step or world size differ, is refused: a load never mixes them.
func (ix *Index) Announce(holder string, origin bool, m Manifest) error {
	if err := m.Validate(); err != nil {
		return err
	}
	s := ix.saves[m.Save]
	if s == nil {
		s = &saveIndex{step: m.Step, world: m.World, pieces: map[int]*pieceIndex{}, created: len(ix.saves)}
		ix.saves[m.Save] = s
	}
	if s.world != m.World {
		return fmt.Errorf("%s: %s says world %d, others %d", m.Save, holder, m.World, s.world)
	}
	p := s.pieces[m.Rank]
	if p == nil {
		p = &pieceIndex{manifest: m, holders: map[string]bool{}}
		s.pieces[m.Rank] = p
	} else if !sameFiles(p.manifest.Files, m.Files) {
		return fmt.Errorf("%s: %s announces other files than its other holders", Piece{m.Save, m.Rank}, holder)
	} else if p.manifest.Files[0].SHA256 == "" {
		p.manifest = m // one with the checksums
	}
	p.holders[holder] = origin
	return nil
}

// sameFiles: the same names and sizes, and the same checksums where both have one.
func sameFiles(a, b []File) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Size != b[i].Size {
			return false
		}
		if a[i].SHA256 != "" && b[i].SHA256 != "" && a[i].SHA256 != b[i].SHA256 {
			return false
		}
	}
	return true
}

// Forget records that holder no longer holds p (it dropped it, or its lease
// ended with its pod).
func (ix *Index) Forget(holder string, p Piece) {
	s := ix.saves[p.Save]
	if s == nil || s.pieces[p.Rank] == nil {
		return
	}
	delete(s.pieces[p.Rank].holders, holder)
	if len(s.pieces[p.Rank].holders) == 0 {
		delete(s.pieces, p.Rank)
	}
	if len(s.pieces) == 0 {
		delete(ix.saves, p.Save)
	}
}

// Holders of p, sorted.
func (ix *Index) Holders(p Piece) []string {
	s := ix.saves[p.Save]
	if s == nil || s.pieces[p.Rank] == nil {
		return nil
	}
	out := make([]string, 0, len(s.pieces[p.Rank].holders))
	for h := range s.pieces[p.Rank].holders {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// Origin is the holder whose trainer wrote p, if it still holds it.
func (ix *Index) Origin(p Piece) (string, bool) {
	s := ix.saves[p.Save]
	if s == nil || s.pieces[p.Rank] == nil {
		return "", false
	}
	for h, origin := range s.pieces[p.Rank].holders {
		if origin {
			return h, true
		}
	}
	return "", false
}

// Manifest of p, with checksums where a holder gave them.
func (ix *Index) Manifest(p Piece) (Manifest, bool) {
	s := ix.saves[p.Save]
	if s == nil || s.pieces[p.Rank] == nil {
		return Manifest{}, false
	}
	return s.pieces[p.Rank].manifest, true
}

// Complete: every rank of the save's world has a piece held somewhere.
func (ix *Index) Complete(save string) bool { return ix.CompleteAmong(save, nil) }

// CompleteAmong: every rank of the save's world has a piece held by a holder
// alive says is there (nil: any). A pod lost with its node still has its
// announcements until their lease ends; its membership ends sooner, and a load
// must not count on what only it held.
func (ix *Index) CompleteAmong(save string, alive func(host string) bool) bool {
	s := ix.saves[save]
	if s == nil || len(s.pieces) != s.world {
		return false
	}
	if alive == nil {
		return true
	}
	for _, p := range s.pieces {
		held := false
		for h := range p.holders {
			if alive(h) {
				held = true
				break
			}
		}
		if !held {
			return false
		}
	}
	return true
}

// Saves, newest first (by step, then by the later announced).
func (ix *Index) Saves() []string {
	out := make([]string, 0, len(ix.saves))
	for name := range ix.saves {
		out = append(out, name)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := ix.saves[out[i]], ix.saves[out[j]]
		if a.step != b.step {
			return a.step > b.step
		}
		if a.created != b.created {
			return a.created > b.created
		}
		return out[i] > out[j]
	})
	return out
}

// Newest is the newest complete save: what a load restores.
func (ix *Index) Newest() (Manifest, bool) { return ix.NewestAmong(nil) }

// NewestAmong is the newest save complete among the holders alive says are there (nil: any).
func (ix *Index) NewestAmong(alive func(host string) bool) (Manifest, bool) {
	for _, name := range ix.Saves() {
		if ix.CompleteAmong(name, alive) {
			m, _ := ix.Manifest(Piece{name, 0})
			return m, true
		}
	}
	return Manifest{}, false
}

// Pieces of a save, by rank.
func (ix *Index) Pieces(save string) []Piece {
	s := ix.saves[save]
	if s == nil {
		return nil
	}
	ranks := make([]int, 0, len(s.pieces))
	for r := range s.pieces {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	out := make([]Piece, len(ranks))
	for i, r := range ranks {
		out[i] = Piece{save, r}
	}
	return out
}

// File finds the piece of save that has the file name.
func (ix *Index) File(save, name string) (Piece, File, bool) {
	for _, p := range ix.Pieces(save) {
		m, _ := ix.Manifest(p)
		for _, f := range m.Files {
			if f.Name == name {
				return p, f, true
			}
		}
	}
	return Piece{}, File{}, false
}
