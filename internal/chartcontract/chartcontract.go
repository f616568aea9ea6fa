// Package chartcontract writes the rules the webhook enforces into the job
// chart (charts/elastic-training/templates/_contract.tpl), so that the chart
// refuses at `helm install` what the webhook would deny later, when the only
// trace is an event on a Job nobody looks at. The rules have one source, this
// module's constants, internal/gpu and internal/torchrunargv; the chart reads them from the generated
// file, and TestChartContractUpToDate fails when the file is stale.
package chartcontract

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/gpu"
	"github.com/elastic-training/elastic-training/internal/torchrunargv"
)

// generatedFile is the generated file, relative to the repository root.
const generatedFile = "charts/elastic-training/templates/_contract.tpl"

// contract is what the chart's checks need of the webhook's rules.
type contract struct {
	SidecarContainer string `json:"sidecarContainer"`
	// SidecarBinary is where every mutated pod finds the rdzv-sidecar binary (the MPI launcher runs its launch).
	SidecarBinary      string            `json:"sidecarBinary"`
	ReservedVolumes    []string          `json:"reservedVolumes"`
	ReservedMountPaths []string          `json:"reservedMountPaths"`
	ReservedPorts      map[string]string `json:"reservedPorts"` // port -> what uses it
	HealthPort         int               `json:"healthPort"`    // the sidecar's /rendezvous (helm test)
	Ports              map[string]int32  `json:"ports"`         // the sidecar's default ports, by use
	PortBase           [2]int            `json:"portBase"`      // bounds of a host-network job's first port
	PortSpan           int               `json:"portSpan"`      // how many ports from there the job takes
	NodePortRange      [2]int            `json:"nodePortRange"` // where a host-network job's ports never go
	MaxSlots           int               `json:"maxSlots"`
	MaxRdzvStandbys    int               `json:"maxRdzvStandbys"`
	SchedulingGate     string            `json:"schedulingGate"`
	Domain             string            `json:"domain"`
	PodAnnotations     []string          `json:"podAnnotations"`
	MutatedAnnotation  string            `json:"mutatedAnnotation"`
	ContractVersion    int               `json:"contractVersion"`    // annotation contract on every pod
	SidecarPlaceholder string            `json:"sidecarPlaceholder"` // the image the webhook replaces in the chart's own pods
	Accelerators       any               `json:"accelerators"`
	// TorchrunValuedFlags: where the chart reads a torchrun command line for flags it refuses, the word after one of
	// these is its value, not the script (as the webhook reads it for the warm start).
	TorchrunValuedFlags []string `json:"torchrunValuedFlags"`
	// LeaseTTL: rendezvous.leaseTTL's bounds and the sidecar's default, in seconds.
	LeaseTTL map[string]int `json:"leaseTTL"`
}

// current is the contract as this module defines it.
func current() contract {
	return contract{
		SidecarContainer:   constants.SidecarContainerName,
		SidecarBinary:      constants.FilesDir + "/" + constants.SidecarBinaryName,
		ReservedVolumes:    []string{constants.FilesVolumeName, constants.TLSVolumeName, constants.TokenVolumeName, constants.DataVolumeName},
		ReservedMountPaths: []string{constants.FilesDir, constants.TLSDir},
		ReservedPorts:      reservedPorts(),
		HealthPort:         constants.SidecarHealthPort,
		Ports: map[string]int32{"client": constants.DefaultPorts.Client, "peer": constants.DefaultPorts.Peer,
			"health": constants.DefaultPorts.Health, "c10d": constants.DefaultPorts.C10d, "checkpoint": constants.DefaultPorts.Checkpoint},
		PortBase:            [2]int{constants.MinRdzvPortBase, constants.MaxRdzvPortBase},
		PortSpan:            constants.PortSpan,
		NodePortRange:       constants.NodePortRange,
		MaxSlots:            constants.MaxSlots,
		MaxRdzvStandbys:     constants.MaxRdzvStandbys,
		SchedulingGate:      constants.SchedulingGate,
		Domain:              constants.Domain,
		PodAnnotations:      constants.PodAnnotations,
		MutatedAnnotation:   constants.AnnotationMutated,
		ContractVersion:     constants.ContractVersion,
		SidecarPlaceholder:  constants.SidecarImagePlaceholder,
		Accelerators:        gpu.Rules,
		TorchrunValuedFlags: torchrunargv.ValuedFlags(),
		LeaseTTL:            map[string]int{"min": constants.MinLeaseTTL, "max": constants.MaxLeaseTTL, "default": constants.DefaultLeaseTTL},
	}
}

// reservedPorts is constants.ReservedPorts as the chart reads them: every
// one, ServeOnly or not, since a value the chart checks (mxnet.psPort) holds
// for the serving pod too.
func reservedPorts() map[string]string {
	m := make(map[string]string, len(constants.ReservedPorts))
	for _, r := range constants.ReservedPorts {
		m[strconv.Itoa(int(r.Port))] = r.What
	}
	return m
}

// template renders c as the chart's named template
// "elastic-training.contract", whose output is JSON (fromJson).
func template(c contract) ([]byte, error) {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("chart contract: %w", err)
	}
	return fmt.Appendf(nil, `{{- /*
GENERATED by internal/chartcontract from internal/constants, internal/gpu and internal/torchrunargv: do not edit.
Regenerate: go test ./internal/chartcontract -update
The webhook's rules, for the chart's checks (_validate.tpl) and its scheduling gate (_pod.tpl).
*/ -}}
{{- define "elastic-training.contract" -}}
%s
{{- end -}}
`, b), nil
}
