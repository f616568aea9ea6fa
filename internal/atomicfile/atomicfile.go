// Package atomicfile replaces files so that a reader sees either the old or
// the new content, never a mix: write a temporary file in the same
// directory, then rename it over the target.
package atomicfile

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces dir/name with data and mode, atomically. It returns false
// without writing when the file already holds data with that mode.
func Write(dir, name string, data []byte, mode fs.FileMode) (bool, error) {
	target := filepath.Join(dir, name)
	if old, err := os.ReadFile(target); err == nil && bytes.Equal(old, data) {
		if st, err := os.Stat(target); err == nil && st.Mode().Perm() == mode.Perm() {
			return false, nil
		}
	}
	if err := WriteFrom(dir, name, bytes.NewReader(data), mode); err != nil {
		return false, err
	}
	return true, nil
}

// WriteFrom replaces dir/name with what r yields, atomically. It does not
// fsync: readers need atomicity, not durability, and the shared volume (an
// emptyDir) does not outlive the pod anyway.
func WriteFrom(dir, name string, r io.Reader, mode fs.FileMode) error {
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
