package sidecar

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/elastic-training/elastic-training/internal/atomicfile"
	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/hostfile"
	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/prestop"
	"github.com/elastic-training/elastic-training/internal/torchbackends/torchleave"
	"github.com/elastic-training/elastic-training/internal/trainerpy"
)

// File modes of what we write into the shared volume.
const (
	hostfileMode = 0o444 // read by launchers, never written by them
	scriptMode   = 0o555 // executed by Horovod's --host-discovery-script
	helperMode   = 0o555 // the launcher helper (this binary)
)

// installFiles prepares dir (when set): the PyTorch preStop script, the
// torchrun rendezvous backend (internal/trainerpy) and,
// with helper, a copy of this binary.
func installFiles(dir string, helper bool, log *slog.Logger) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--files-dir: %w", err)
	}
	if err := prestop.Install(dir, constants.LeaveScriptName); err != nil {
		return err
	}
	if err := torchleave.Install(dir); err != nil { // imported by the script for torch's own backends alone
		return err
	}
	if err := trainerpy.Install(dir); err != nil {
		return err
	}
	helperPath := ""
	if helper {
		if err := installSelf(dir, constants.SidecarBinaryName); err != nil {
			return err
		}
		helperPath = dir + "/" + constants.SidecarBinaryName
	}
	log.Info("installed preStop script and rendezvous backend", "prestop", dir+"/"+constants.LeaveScriptName,
		"rendezvous_backend", dir+"/"+trainerpy.Dir, "launcher_helper", helperPath)
	return nil
}

// installSelf copies this executable into dir as name, so a launcher in any
// image can run `<dir>/rdzv-sidecar wait ...`. It streams the copy (the
// binary is tens of MiB; reading it whole would stay in RSS).
func installSelf(dir, name string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install sidecar binary: %w", err)
	}
	src, err := os.Open(exe)
	if err != nil {
		return fmt.Errorf("install sidecar binary: %w", err)
	}
	defer src.Close()
	if err := atomicfile.WriteFrom(dir, name, src, helperMode); err != nil {
		return fmt.Errorf("install sidecar binary: %w", err)
	}
	return nil
}

// hostFiles keeps a directory's hostfile and discovery script in step with
// the membership.
type hostFiles struct {
	dir     string
	flavour hostfile.Flavour
}

// write renders ms and replaces both files atomically (unchanged files are
// left alone). With no members the hostfile is removed, never left empty:
// Hydra would silently run every rank locally from an empty one.
func (f hostFiles) write(ms []membership.Member) (changed bool, err error) {
	if len(ms) == 0 {
		if err := os.Remove(filepath.Join(f.dir, constants.HostfileName)); err == nil {
			changed = true
		} else if !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("remove hostfile: %w", err)
		}
	} else {
		data, err := hostfile.Render(f.flavour, ms)
		if err != nil {
			return false, err
		}
		if changed, err = atomicfile.Write(f.dir, constants.HostfileName, data, hostfileMode); err != nil {
			return false, err
		}
	}
	script, err := hostfile.DiscoverScript(ms)
	if err != nil {
		return changed, err
	}
	c, err := atomicfile.Write(f.dir, constants.DiscoverHostsName, script, scriptMode)
	return changed || c, err
}
