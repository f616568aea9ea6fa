package hostfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// WriteAtomic replaces dir/name with data and mode, so that a reader sees
// either the old or the new content, never a mix: it writes a temporary file
// in the same directory and renames it over the target. It returns
// false without writing when the file already holds data with that mode.
func WriteAtomic(dir, name string, data []byte, mode fs.FileMode) (bool, error) {
	target := filepath.Join(dir, name)
	if old, err := os.ReadFile(target); err == nil && bytes.Equal(old, data) {
		if st, err := os.Stat(target); err == nil && st.Mode().Perm() == mode.Perm() {
			return false, nil
		}
	}
	if err := WriteAtomicFrom(dir, name, bytes.NewReader(data), mode); err != nil {
		return false, err
	}
	return true, nil
}

// WriteAtomicFrom replaces dir/name with what r yields, atomically (temp
// file in the same directory, then rename). It does not fsync: readers need
// atomicity, not durability, and the shared volume (an emptyDir) does not
// outlive the pod anyway.
func WriteAtomicFrom(dir, name string, r io.Reader, mode fs.FileMode) error {
	target := filepath.Join(dir, name)
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", target, err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", target, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", target, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", target, err)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return fmt.Errorf("write %s: %w", target, err)
	}
	return nil
}

// Files keeps a directory's hostfile and discovery script in step with the
// membership.
type Files struct {
	Dir      string
	Flavour  Flavour
	Hostfile string // file name; default constants.HostfileName
	Script   string // file name; default constants.DiscoverHostsName
}

// Write renders ms and replaces both files atomically (unchanged files are
// left alone). With no members the hostfile is removed, never left empty:
// Hydra would silently run every rank locally from an empty one.
func (f Files) Write(ms []Member) (changed bool, err error) {
	hostName, scriptName := f.Hostfile, f.Script
	if hostName == "" {
		hostName = constants.HostfileName
	}
	if scriptName == "" {
		scriptName = constants.DiscoverHostsName
	}
	if len(ms) == 0 {
		if err := os.Remove(filepath.Join(f.Dir, hostName)); err == nil {
			changed = true
		} else if !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("remove hostfile: %w", err)
		}
	} else {
		data, err := Render(f.Flavour, ms)
		if err != nil {
			return false, err
		}
		c, err := WriteAtomic(f.Dir, hostName, data, HostfileMode)
		if err != nil {
			return false, err
		}
		changed = changed || c
	}
	script, err := DiscoverScript(ms)
	if err != nil {
		return changed, err
	}
	c, err := WriteAtomic(f.Dir, scriptName, script, ScriptMode)
	return changed || c, err
}
