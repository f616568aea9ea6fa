// Package rdzvpy is the trainer's half of the job's own torchrun rendezvous:
// the Python package et_rdzv and its dist-info, which registers it as the
// torchrun.handlers entry point "elastic-training" (docs/own-rendezvous.md).
// The sidecar installs both into the files directory it shares with the
// trainer, and the webhook puts Dir on the trainer's PYTHONPATH: torch finds
// the backend with no pip and no change to the image.
package rdzvpy

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/elastic-training/elastic-training/internal/atomicfile"
	"github.com/elastic-training/elastic-training/internal/constants"
)

// Backend is the name torchrun's --rdzv-backend gives it.
const Backend = constants.BackendOwn

// Dir is where, under the files directory, the package is installed: the
// PYTHONPATH entry.
const Dir = constants.PythonDirName

//go:embed all:python
var files embed.FS // all: __init__.py begins with _

// mode: read by python3, never written by the trainer.
const mode = 0o444

// Install writes the package and its dist-info under filesDir/Dir.
func Install(filesDir string) error {
	return fs.WalkDir(files, Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		dir := filepath.Join(filesDir, filepath.FromSlash(path.Dir(p)))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("install rendezvous backend: %w", err)
		}
		if err := atomicfile.WriteFrom(dir, path.Base(p), bytes.NewReader(data), mode); err != nil {
			return fmt.Errorf("install rendezvous backend: %w", err)
		}
		return nil
	})
}
