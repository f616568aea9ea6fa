package hostfile

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteAtomic replaces dir/name with data and mode, so that a reader sees
// either the old or the new content, never a mix: it writes a temporary file
// in the same directory, syncs it and renames it over the target. It returns
// false without writing when the file already holds data with that mode.
func WriteAtomic(dir, name string, data []byte, mode fs.FileMode) (bool, error) {
	target := filepath.Join(dir, name)
	if old, err := os.ReadFile(target); err == nil && bytes.Equal(old, data) {
		if st, err := os.Stat(target); err == nil && st.Mode().Perm() == mode.Perm() {
			return false, nil
		}
	}
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return false, fmt.Errorf("write %s: %w", target, err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return false, fmt.Errorf("write %s: %w", target, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return false, fmt.Errorf("write %s: %w", target, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return false, fmt.Errorf("write %s: %w", target, err)
	}
	if err := tmp.Close(); err != nil {
		return false, fmt.Errorf("write %s: %w", target, err)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return false, fmt.Errorf("write %s: %w", target, err)
	}
	return true, nil
}
