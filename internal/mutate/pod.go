package mutate

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// The pod edits Mutate makes besides the sidecar container itself, each of
// which keeps what the user set or denies what conflicts with it, and the
// checks that the pod leaves room for the sidecar.

// setEnv adds v to c unless the user already set that variable: the user's
// value wins, with a warning when it differs from the computed one.
func setEnv(e *editor, containerPath string, c *corev1.Container, v corev1.EnvVar) {
	for _, have := range c.Env {
		if have.Name != v.Name {
			continue
		}
		if have.ValueFrom == nil && have.Value != v.Value {
			e.warn("env %s=%q set in container %q is kept; the webhook computed %q", v.Name, have.Value, c.Name, v.Value)
		}
		return
	}
	appendTo(e, containerPath+"/env", &c.Env, v)
}

// prependPath puts dir first on the container's search path name
// (PYTHONPATH): set alone where the container sets none, else before the
// trainer's own entries. A value from a reference cannot be edited: it is
// kept, with a warning.
func prependPath(e *editor, containerPath string, c *corev1.Container, name, dir string) {
	i := slices.IndexFunc(c.Env, func(v corev1.EnvVar) bool { return v.Name == name })
	if i < 0 {
		appendTo(e, containerPath+"/env", &c.Env, corev1.EnvVar{Name: name, Value: dir})
		return
	}
	have := &c.Env[i]
	switch {
	case have.ValueFrom != nil:
		e.warn("env %s in container %q comes from a reference and is kept: add %s to it, or the rendezvous backend is not found", have.Name, c.Name, dir)
	case slices.Contains(strings.Split(have.Value, ":"), dir):
	default:
		value := dir
		if have.Value != "" {
			value += ":" + have.Value
		}
		e.add(fmt.Sprintf("%s/env/%d/value", containerPath, i), value)
		have.Value = value
	}
}

// setMount mounts volume at mountPath in c; another volume at that path is a conflict.
func setMount(e *editor, containerPath string, c *corev1.Container, volume, mountPath string, readOnly bool) error {
	for _, m := range c.VolumeMounts {
		if m.MountPath == mountPath && m.Name != volume {
			return fmt.Errorf("container %q mounts volume %q at %s, which the webhook needs for volume %q: mount it elsewhere", c.Name, m.Name, mountPath, volume)
		}
		if m.Name == volume && m.MountPath == mountPath {
			return nil
		}
	}
	appendTo(e, containerPath+"/volumeMounts", &c.VolumeMounts, corev1.VolumeMount{Name: volume, MountPath: mountPath, ReadOnly: readOnly})
	return nil
}

// setVolume adds the emptyDir name; a volume of that name that is not an
// emptyDir is a conflict (the sidecar must be able to write to it).
func setVolume(e *editor, name string) error {
	for _, v := range e.pod.Spec.Volumes {
		if v.Name == name {
			if v.EmptyDir == nil {
				return fmt.Errorf("volume name %q is reserved for the emptyDir the webhook shares with the sidecar: rename the pod's volume", name)
			}
			return nil
		}
	}
	appendTo(e, "/spec/volumes", &e.pod.Spec.Volumes, corev1.Volume{
		Name:         name,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
	})
	return nil
}

// setSecretVolume adds a volume name from Secret secret. A pod volume of that
// name from the same Secret is kept (a re-mutation, or the API server's
// defaults on it); anything else is a conflict: the sidecar and the trainer
// must read the Secret the annotation names, not whatever the pod put there.
func setSecretVolume(e *editor, name, secret string) error {
	for _, v := range e.pod.Spec.Volumes {
		if v.Name == name {
			if v.Secret == nil || v.Secret.SecretName != secret {
				return fmt.Errorf("volume name %q is reserved for the rendezvous TLS Secret %q (annotation %s): rename the pod's volume",
					name, secret, constants.AnnotationRdzvTLSSecret)
			}
			return nil
		}
	}
	appendTo(e, "/spec/volumes", &e.pod.Spec.Volumes, corev1.Volume{
		Name:         name,
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}},
	})
	return nil
}

// setTokenVolume adds tokenVolume; a pod volume of that name that is not a
// projected volume is a conflict.
func setTokenVolume(e *editor, s *settings) error {
	for _, v := range e.pod.Spec.Volumes {
		if v.Name == constants.TokenVolumeName {
			if v.Projected == nil {
				return fmt.Errorf("volume name %q is reserved for the rendezvous sidecar's API token: rename the pod's volume", v.Name)
			}
			return nil
		}
	}
	appendTo(e, "/spec/volumes", &e.pod.Spec.Volumes, tokenVolume(s))
	return nil
}

// checkPorts denies pods whose containers already use the sidecar's ports
// (ports.Reserved(); all containers of a pod share one network
// namespace). Only the serving sidecar listens on the ServeOnly ones.
func checkPorts(pod *corev1.Pod, ports constants.Ports, serving bool) error {
	taken := map[int32]string{}
	for _, r := range ports.Reserved() {
		if serving || !r.ServeOnly {
			taken[r.Port] = r.What
		}
	}
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for _, c := range list {
			if c.Name == constants.SidecarContainerName {
				continue
			}
			for _, p := range c.Ports {
				if what, ok := taken[p.ContainerPort]; ok {
					return fmt.Errorf("container %q declares port %d, which is %s: use another port", c.Name, p.ContainerPort, what)
				}
			}
		}
	}
	return nil
}

// leaveCommand is the PyTorch trainer's preStop hook: torchrun's agent does
// not leave the rendezvous on SIGTERM, so without it the survivors of a
// scale-down wait for torch's dead-node timeout (15 s in torch 1.13) before
// they re-form. The script is best effort and always exits 0.
var leaveCommand = []string{"python3", path.Join(constants.FilesDir, constants.LeaveScriptName)}

// setLeaveHook makes leaveCommand c's preStop hook unless the user set one:
// theirs wins, with a warning, since a pod runs one preStop hook per container.
func setLeaveHook(e *editor, containerPath string, c *corev1.Container) {
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		if h := c.Lifecycle.PreStop.Exec; h == nil || !slices.Equal(h.Command, leaveCommand) {
			e.warn("container %q keeps its own preStop hook; without %q a scale-down waits for torch's dead-node timeout",
				c.Name, strings.Join(leaveCommand, " "))
		}
		return
	}
	hook := &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: slices.Clone(leaveCommand)}}
	if c.Lifecycle == nil {
		set(e, containerPath+"/lifecycle", &c.Lifecycle, &corev1.Lifecycle{PreStop: hook})
		return
	}
	set(e, containerPath+"/lifecycle/preStop", &c.Lifecycle.PreStop, hook)
}

// shareProcesses puts the pod's containers in one PID namespace, so that the
// leave hook can stop the torchrun agent with SIGKILL: torch 2.3 to 2.7 close
// the whole rendezvous when an agent gets SIGTERM (LocalElasticAgent._shutdown
// calls the handler's shutdown()), which ends every survivor of a scale-down
// with RendezvousClosedError. The agent is usually the container's PID 1,
// which ignores SIGKILL from inside its own namespace; in the pod's shared
// namespace PID 1 is the pause process. A user's explicit false is kept.
func shareProcesses(e *editor) {
	spec := &e.pod.Spec
	if spec.ShareProcessNamespace == nil {
		set(e, "/spec/shareProcessNamespace", &spec.ShareProcessNamespace, ptr.To(true))
		return
	}
	if !*spec.ShareProcessNamespace {
		e.warn("spec.shareProcessNamespace=false is kept; on torch 2.3 to 2.7 a scale-down then closes the rendezvous for every worker (the leave hook cannot stop the agent before its SIGTERM)")
	}
}

func isOurGate(g corev1.PodSchedulingGate) bool { return g.Name == constants.SchedulingGate }

// openGate removes the chart's scheduling gate (constants.SchedulingGate);
// other gates (a queue's, the user's) stay.
func openGate(e *editor) {
	gates := e.pod.Spec.SchedulingGates
	i := slices.IndexFunc(gates, isOurGate)
	switch {
	case i < 0:
	case len(gates) == 1: // the whole list, so that the result has none rather than an empty one
		e.pod.Spec.SchedulingGates = nil
		e.remove("/spec/schedulingGates")
	default:
		e.pod.Spec.SchedulingGates = slices.Delete(slices.Clone(gates), i, i+1)
		e.remove("/spec/schedulingGates/" + strconv.Itoa(i))
	}
}
