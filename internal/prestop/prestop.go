// Package prestop is the PyTorch trainer's preStop hook, leave_rendezvous.py
// (see its docstring): it takes the stopping pod's torchrun agent out of the
// rendezvous so that a scale-down does not wait for a dead-node timeout. On the
// elastic-training backend that is one SET of a key; torch's own backends need
// internal/torchbackends/torchleave, which it imports for them alone. The
// sidecar installs both into the files directory it shares with the trainer.
// It is Python because only the trainer's image is sure to have what reads
// torch's pickled state.
package prestop

import (
	"bytes"
	_ "embed"
	"fmt"

	"github.com/elastic-training/elastic-training/internal/atomicfile"
)

//go:embed leave_rendezvous.py
var script []byte

// mode: run by python3, never written by the trainer.
const mode = 0o444

// Install writes the script into dir as name.
func Install(dir, name string) error {
	if err := atomicfile.WriteFrom(dir, name, bytes.NewReader(script), mode); err != nil {
		return fmt.Errorf("install preStop script: %w", err)
	}
	return nil
}
