package checkpoint

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// fixtureLocalIndex is a local index (LOCAL-INDEX.json, the trust index a
// node keeps beside its local checkpoint copy) written once by
// TrustIndex.write at trustVersion 1.
//
// RULE: a format change must be a new version (trustVersion), with a new
// fixture next to this one, and the old fixture still read (or, for this
// file only, knowingly ignored: an index of another version makes local
// recovery hash every file, never misread one; say so in the test then).
// Never edit or regenerate a committed fixture to make this test pass.
// "go test ./checkpoint -run TestLocalIndexFixture -rewrite" writes only missing
// fixtures.
const fixtureLocalIndex = "testdata/format-1/" + LocalIndexName

// fixtureTrustIndex is the content of fixtureLocalIndex, written out.
func fixtureTrustIndex() *TrustIndex {
	return &TrustIndex{
		FormatVersion: 1,
		Files: map[string]TrustEntry{
			"slot-0/000005.sst":      {Size: 1234, SHA256: strings.Repeat("ab", 32), Inode: 1048577, MtimeNs: 1767323045123456789},
			"slot-0/MANIFEST-000001": {Size: 56, SHA256: strings.Repeat("01", 32), Inode: 1048578, MtimeNs: 1767323045000000001},
			"slot-1/OPTIONS-000003":  {Size: 78, SHA256: strings.Repeat("02", 32), Inode: 4294967296, MtimeNs: -1},
		},
	}
}

// TestFixtures decodes the committed local index and compares every field
// with the values written above; a renamed JSON tag or a changed meaning of
// a field fails here. See the RULE above.
func TestLocalIndexFixture(t *testing.T) {
	if *rewrite {
		if _, err := os.Stat(fixtureLocalIndex); errors.Is(err, fs.ErrNotExist) {
			if err := os.MkdirAll(filepath.Dir(fixtureLocalIndex), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := fixtureTrustIndex().Write(fixtureLocalIndex); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s", fixtureLocalIndex)
		} else {
			t.Logf("kept %s", fixtureLocalIndex)
		}
	}
	t.Run("local-index-v1", func(t *testing.T) {
		got := ReadTrustIndex(fixtureLocalIndex)
		want := fixtureTrustIndex()
		if got.FormatVersion != want.FormatVersion || len(got.Files) == 0 {
			t.Fatalf("the committed v1 local index reads as format_version %d with %d files (readTrustIndex ignores an index it cannot read)", got.FormatVersion, len(got.Files))
		}
		for name, w := range want.Files {
			g, ok := got.Files[name]
			switch {
			case !ok:
				t.Errorf("%s: missing", name)
			case g.Size != w.Size:
				t.Errorf("%s: size %d, want %d", name, g.Size, w.Size)
			case g.SHA256 != w.SHA256:
				t.Errorf("%s: sha256 %s, want %s", name, g.SHA256, w.SHA256)
			case g.Inode != w.Inode:
				t.Errorf("%s: inode %d, want %d", name, g.Inode, w.Inode)
			case g.MtimeNs != w.MtimeNs:
				t.Errorf("%s: mtime_ns %d, want %d", name, g.MtimeNs, w.MtimeNs)
			}
		}
		if !t.Failed() && !reflect.DeepEqual(got, want) {
			t.Errorf("local index differs:\n got %+v\nwant %+v", got, want)
		}
	})
	// The encoder of the current version still writes the committed bytes:
	// an added or renamed field is a format change even when the old bytes
	// still decode.
	t.Run("encoder-unchanged", func(t *testing.T) {
		if trustVersion != 1 {
			t.Skip("the current format is not 1: compare with its own fixture")
		}
		committed, err := os.ReadFile(fixtureLocalIndex)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), LocalIndexName)
		if err := fixtureTrustIndex().Write(path); err != nil {
			t.Fatal(err)
		}
		fresh, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fresh, committed) {
			t.Errorf("TrustIndex.write no longer writes %s:\n got %s\nwant %s\na format change needs a new trustVersion and a new fixture", fixtureLocalIndex, fresh, committed)
		}
	})
}
