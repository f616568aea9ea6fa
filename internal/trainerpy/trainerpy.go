// Package trainerpy is the Python package every PyTorch trainer gets,
// elastic_training, and its dist-info: elastic_training.rendezvous is the
// trainer's half of the elastic-training rendezvous backend, registered as the
// torchrun.handlers entry point "elastic-training"
// (docs/elastic-training-backend.md).
// The sidecar installs both into the files directory it shares with the
// trainer, and the webhook puts Dir on the trainer's PYTHONPATH: torch finds
// the backend with no pip and no change to the image.
package trainerpy

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
const Backend = constants.BackendElasticTraining

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
