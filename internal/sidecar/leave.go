package sidecar

import (
	"bytes"
	_ "embed"
	"fmt"

	"github.com/elastic-training/elastic-training/internal/hostfile"
)

// leaveScript is the PyTorch trainer's preStop hook (see its docstring): it
// takes the stopping pod's torchrun agent out of the etcd-v2 rendezvous so
// that a scale-down does not wait for torch's dead-node heartbeat timeout.
//
//go:embed leave_rendezvous.py
var leaveScript []byte

// InstallLeaveScript writes the preStop script into dir as name. It is
// Python because only the trainer's image is sure to have what reads
// torch's pickled rendezvous state.
func InstallLeaveScript(dir, name string) error {
	if err := hostfile.WriteAtomicFrom(dir, name, bytes.NewReader(leaveScript), 0o444); err != nil {
		return fmt.Errorf("install preStop script: %w", err)
	}
	return nil
}
