// Package checkpoint is the pure core of the job's in-memory checkpoints
// (docs/checkpoints.md): what a rank's save of a step is (a Manifest of its
// files), which pod holds which piece (Index), when a step is complete, and
// who should hold a copy of each piece (Desired). The sidecars' I/O around it
// (the shared directory, the job's store, the peers' HTTP) is
// checkpoint/holder; the trainer's half is the Python package
// elastic_training.checkpoint (internal/trainerpy).
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// File is one file of a rank's piece of a save, as DCP wrote it.
type File struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"` // hex; set by the sidecar that announces the piece
}

// Manifest is one rank's piece of one save: written by the trainer
// (rank-<R>.json in the save's directory) once its part of the save is on
// disk, and announced in the job's store by each pod that holds the piece.
type Manifest struct {
	Save  string `json:"save"` // the save's directory name, SaveName
	Step  int64  `json:"step"`
	Rank  int    `json:"rank"`
	World int    `json:"world"` // the world size the save was taken at
	Files []File `json:"files"`
}

// Bounds of what a manifest may say: a parser of a peer's announcement must not
// be made to hold more than this.
const (
	MaxWorld     = 1 << 16
	MaxFiles     = 1 << 10
	maxManifest  = 1 << 20 // bytes of JSON
	maxNameBytes = 255
)

var saveName = regexp.MustCompile(`^step-([0-9]{12})-([0-9a-f]{8,32})$`)

// SaveName is the directory name of a save of step with the save id id (hex,
// chosen by rank 0 so that two saves of one step never mix).
func SaveName(step int64, id string) string { return fmt.Sprintf("step-%012d-%s", step, id) }

// ParseSaveName returns the step of a save's directory name.
func ParseSaveName(name string) (int64, error) {
	m := saveName.FindStringSubmatch(name)
	if m == nil {
		return 0, fmt.Errorf("save %.80q: not step-<12 digits>-<hex id>", name)
	}
	return strconv.ParseInt(m[1], 10, 64)
}

// ValidFileName: a DCP file of one save directory (`__<rank>_<n>.distcp`,
// `.metadata`): one path element, nothing a path could climb out with.
func ValidFileName(name string) error {
	if name == "" || len(name) > maxNameBytes || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") {
		return fmt.Errorf("file %.80q: not a file name of a save", name)
	}
	return nil
}

// ParseManifest decodes and checks a manifest (the trainer's file or a peer's
// announcement).
func ParseManifest(data []byte) (Manifest, error) {
	var m Manifest
	if len(data) > maxManifest {
		return m, fmt.Errorf("manifest: %d bytes, more than %d", len(data), maxManifest)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("manifest: %w", err)
	}
	if dec.More() {
		return Manifest{}, errors.New("manifest: data after the object")
	}
	return m, m.Validate()
}

// Validate checks what a manifest says about itself.
func (m Manifest) Validate() error {
	step, err := ParseSaveName(m.Save)
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	if step != m.Step {
		return fmt.Errorf("manifest of %s: step %d is not the save's", m.Save, m.Step)
	}
	if m.World < 1 || m.World > MaxWorld {
		return fmt.Errorf("manifest of %s: world %d is not 1 to %d", m.Save, m.World, MaxWorld)
	}
	if m.Rank < 0 || m.Rank >= m.World {
		return fmt.Errorf("manifest of %s: rank %d is not below the world size %d", m.Save, m.Rank, m.World)
	}
	if len(m.Files) == 0 || len(m.Files) > MaxFiles {
		return fmt.Errorf("manifest of %s rank %d: %d files (1 to %d)", m.Save, m.Rank, len(m.Files), MaxFiles)
	}
	seen := map[string]bool{}
	for _, f := range m.Files {
		if err := ValidFileName(f.Name); err != nil {
			return fmt.Errorf("manifest of %s rank %d: %w", m.Save, m.Rank, err)
		}
		if seen[f.Name] {
			return fmt.Errorf("manifest of %s rank %d: file %q twice", m.Save, m.Rank, f.Name)
		}
		seen[f.Name] = true
		if f.Size < 0 {
			return fmt.Errorf("manifest of %s rank %d: file %q has a negative size", m.Save, m.Rank, f.Name)
		}
		if f.SHA256 != "" && !isHex(f.SHA256, 64) {
			return fmt.Errorf("manifest of %s rank %d: file %q: sha256 is not 64 hex digits", m.Save, m.Rank, f.Name)
		}
	}
	return nil
}

// Bytes is the piece's size.
func (m Manifest) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// Encode is the manifest as stored.
func (m Manifest) Encode() []byte {
	b, _ := json.Marshal(m)
	return b
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
