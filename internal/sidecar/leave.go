package sidecar

import (
	"bytes"
	_ "embed"
	"fmt"

	"github.com/elastic-training/elastic-training/internal/atomicfile"
)

// leaveScript is the PyTorch trainer's preStop hook (see its docstring): it
// takes the stopping pod's torchrun agent out of the etcd-v2 rendezvous so
// that a scale-down does not wait for torch's dead-node heartbeat timeout.
//
//go:embed leave_rendezvous.py
var leaveScript []byte

// installLeaveScript writes the preStop script into dir as name. It is
// Python because only the trainer's image is sure to have what reads
// torch's pickled rendezvous state.
func installLeaveScript(dir, name string) error {
	if err := atomicfile.WriteFrom(dir, name, bytes.NewReader(leaveScript), leaveMode); err != nil {
		return fmt.Errorf("install preStop script: %w", err)
	}
	return nil
}
