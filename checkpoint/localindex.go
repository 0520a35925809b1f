package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"cairn/internal/base/datadir"
	"cairn/internal/base/sysfile"
	"cairn/state"
)

// Trust indexes: a record that local files, as identified by (size,
// inode, mtime), had a known checksum, so a restore can use them without
// hashing them again. The writer keeps one beside each local checkpoint
// copy it committed (LOCAL-INDEX.json); a standby keeps one for its cache.

// trustVersion is the format of a trust index file.
//
// INVARIANT: bump it when TrustIndex's fields change meaning; an index of
// another version is ignored (every file is then hashed), never misread.
const trustVersion = 1

// LocalIndexName is the trust index WriteLocalIndex writes into a local
// checkpoint folder (next to its slot-<i> folders, not inside them: the
// checkpoint writer uploads every file of a slot folder).
const LocalIndexName = "LOCAL-INDEX.json"

// TrustEntry records that a file, as identified by (size, inode, mtime), had
// content with SHA256.
type TrustEntry struct {
	Size    int64  `json:"size"`
	SHA256  string `json:"sha256"`
	Inode   uint64 `json:"inode"`
	MtimeNs int64  `json:"mtime_ns"`
}

// TrustIndex maps a file's path, relative to the index's folder and
// slash-separated, to what was known about it.
type TrustIndex struct {
	FormatVersion int                   `json:"format_version"`
	Files         map[string]TrustEntry `json:"files"`
}

func NewTrustIndex() *TrustIndex {
	return &TrustIndex{FormatVersion: trustVersion, Files: map[string]TrustEntry{}}
}

// ReadTrustIndex reads an index; a missing, unreadable or foreign-version
// index is an empty one (files are hashed instead).
func ReadTrustIndex(path string) *TrustIndex {
	b, err := os.ReadFile(path)
	if err != nil {
		return NewTrustIndex()
	}
	var x TrustIndex
	if json.Unmarshal(b, &x) != nil || x.FormatVersion != trustVersion || x.Files == nil {
		return NewTrustIndex()
	}
	return &x
}

// Write writes the index atomically to path.
func (x *TrustIndex) Write(path string) error {
	b, err := json.Marshal(x)
	if err != nil {
		return err
	}
	return datadir.WriteFileAtomic(path, b)
}

// identity returns a file's (size, inode, mtime).
func identity(fi os.FileInfo) (size int64, ino uint64, mtime int64) {
	_, ino, _ = sysfile.ID(fi)
	return fi.Size(), ino, fi.ModTime().UnixNano()
}

// EntryFor records a file's current identity with its known checksum.
func EntryFor(path, sum string) (TrustEntry, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return TrustEntry{}, err
	}
	size, ino, mt := identity(fi)
	return TrustEntry{Size: size, SHA256: sum, Inode: ino, MtimeNs: mt}, nil
}

// Trusts reports whether the index vouches that the file at path, as it is
// now, has the object's size and checksum.
func (x *TrustIndex) Trusts(rel, path string, o Object) bool {
	e, ok := x.Files[rel]
	if !ok || e.SHA256 != o.SHA256 || e.Size != o.Size {
		return false
	}
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	size, ino, mt := identity(fi)
	return size == e.Size && ino == e.Inode && mt == e.MtimeNs
}

// HashFile returns the hex SHA-256 and length of a file.
func HashFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", n, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// WriteLocalIndex records that the files of a local checkpoint folder
// (<data_dir>/checkpoints/chk-<id>, holding slot-<i>/<file>) match the
// objects of the manifest that was just committed from them, so a later
// local recovery can use them without hashing. Call it right after the
// commit: the checkpoint writer hashed these very files. Files that are
// missing or of another size are left out (they will be hashed or
// downloaded). The index is written atomically to chkDir/LOCAL-INDEX.json.
func WriteLocalIndex(chkDir string, objects []Object) error {
	x := NewTrustIndex()
	for _, o := range objects {
		rel := datadir.SlotName(o.Slot) + "/" + o.File
		if state.RemoteIncomplete(filepath.Join(chkDir, filepath.FromSlash(rel))) {
			// An online restore's SST not yet downloaded: the index must
			// not vouch for its zeros; a restart hashes it instead.
			continue
		}
		e, err := EntryFor(filepath.Join(chkDir, filepath.FromSlash(rel)), o.SHA256)
		if err != nil || e.Size != o.Size {
			continue
		}
		x.Files[rel] = e
	}
	if err := x.Write(filepath.Join(chkDir, LocalIndexName)); err != nil {
		return fmt.Errorf("checkpoint: write local index %s: %w", chkDir, err)
	}
	return nil
}
