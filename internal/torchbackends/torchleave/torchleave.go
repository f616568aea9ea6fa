// Package torchleave is the half of the PyTorch trainer's preStop hook that only torch's own rendezvous backends
// need, leave_torch.py (see its docstring): it takes the stopping pod's torchrun agent out of the c10d, etcd-v2 or
// legacy etcd rendezvous, editing torch's pickled state, so that a scale-down does not wait for torch's dead-node
// timeout. The sidecar installs it next to the hook's script (internal/prestop), which imports it for those
// backends alone.
package torchleave

import (
	"bytes"
	_ "embed"
	"fmt"

	"github.com/elastic-training/elastic-training/internal/atomicfile"
)

//go:embed leave_torch.py
var script []byte

// Name is the module's file name: leave-rendezvous.py imports leave_torch from its own directory.
const Name = "leave_torch.py"

// mode: read by python3, never written by the trainer.
const mode = 0o444

// Install writes the module into dir.
func Install(dir string) error {
	if err := atomicfile.WriteFrom(dir, Name, bytes.NewReader(script), mode); err != nil {
		return fmt.Errorf("install preStop script's torch half: %w", err)
	}
	return nil
}
