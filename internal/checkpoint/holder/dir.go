package holder

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"

	"github.com/elastic-training/elastic-training/internal/checkpoint"
)

// The directory: one subdirectory per save (checkpoint.SaveName) holding DCP's
// files, the trainer's rank-<R>.json for each rank of this pod (written last,
// once that rank's files are complete) and this sidecar's copy-<R>.json for
// each piece fetched from a peer (likewise written last).
var pieceFile = regexp.MustCompile(`^(rank|copy)-([0-9]{1,5})\.json$`)

// local is one piece in the directory.
type local struct {
	manifest checkpoint.Manifest
	origin   bool // rank-<R>.json: this pod's trainer wrote it
}

// scan lists the saves in dir and the pieces whose manifest is there; a
// manifest that does not parse or does not match its directory is logged by
// the caller (bad) and left alone.
func scan(dir string) (saves []string, pieces []local, bad []error, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, err := checkpoint.ParseSaveName(e.Name()); err != nil {
			continue
		}
		saves = append(saves, e.Name())
		files, err := os.ReadDir(filepath.Join(dir, e.Name()))
		if err != nil {
			bad = append(bad, err)
			continue
		}
		for _, f := range files {
			m := pieceFile.FindStringSubmatch(f.Name())
			if m == nil {
				continue
			}
			data, err := os.ReadFile(filepath.Join(dir, e.Name(), f.Name()))
			if err != nil {
				bad = append(bad, err)
				continue
			}
			man, err := checkpoint.ParseManifest(data)
			rank, _ := strconv.Atoi(m[2])
			if err == nil && (man.Save != e.Name() || man.Rank != rank) {
				err = fmt.Errorf("%s/%s: says %s", e.Name(), f.Name(), checkpoint.Piece{Save: man.Save, Rank: man.Rank})
			}
			if err != nil {
				bad = append(bad, err)
				continue
			}
			pieces = append(pieces, local{manifest: man, origin: m[1] == "rank"})
		}
	}
	return saves, pieces, bad, nil
}

// checksum gives each file of m its size as found and its SHA-256: the trainer's
// manifest names the files, the sidecar vouches for their bytes.
func checksum(dir string, m checkpoint.Manifest) (checkpoint.Manifest, error) {
	files := make([]checkpoint.File, len(m.Files))
	for i, f := range m.Files {
		h := sha256.New()
		file, err := os.Open(filepath.Join(dir, m.Save, f.Name))
		if err != nil {
			return m, fmt.Errorf("%s: %w", checkpoint.Piece{Save: m.Save, Rank: m.Rank}, err)
		}
		n, err := io.Copy(h, file)
		file.Close()
		if err != nil {
			return m, fmt.Errorf("%s: %w", checkpoint.Piece{Save: m.Save, Rank: m.Rank}, err)
		}
		if n != f.Size {
			return m, fmt.Errorf("%s: %s has %d bytes, its manifest says %d", checkpoint.Piece{Save: m.Save, Rank: m.Rank}, f.Name, n, f.Size)
		}
		files[i] = checkpoint.File{Name: f.Name, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}
	}
	m.Files = files
	return m, nil
}

// writeChecked writes name under dir from r: exactly size bytes whose SHA-256
// is sum, or nothing (the bytes go to a temporary file, renamed into place only
// once checked).
func writeChecked(dir, name string, r io.Reader, size int64, sum string) error {
	tmp, err := os.CreateTemp(dir, ".fetch-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, size+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return fmt.Errorf("%s: after %d bytes: %w", name, n, err)
	case n != size:
		return fmt.Errorf("%s: %d bytes, expected %d", name, n, size)
	case hex.EncodeToString(h.Sum(nil)) != sum:
		return fmt.Errorf("%s: its bytes do not match its checksum", name)
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, name))
}

// usage is the bytes of the files under dir, each file once: the trainer hard-links a save it copies to the job's
// volume (.persist-<pid>-<save>), and those links hold no bytes more.
func usage(dir string) (int64, error) {
	var total int64
	seen := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return nil
			}
			if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
				if seen[st.Ino] {
					return nil
				}
				seen[st.Ino] = true
			}
			total += info.Size()
		}
		return nil
	})
	return total, err
}
