package ociarchive

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An archive laid out as podman saves one: index.json naming one manifest, the manifest blob
// under blobs/sha256, and a layer too large to be read.
func TestManifestDigest(t *testing.T) {
	const image = "ghcr.io/berth-ci/berth:v1.2.3"
	manifest := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}`)
	sum := sha256.Sum256(manifest)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	index := func(entries ...string) []byte {
		return []byte(`{"schemaVersion":2,"manifests":[` + strings.Join(entries, ",") + `]}`)
	}
	entry := func(mediaType, digest string, size int, name string) string {
		return fmt.Sprintf(`{"mediaType":%q,"digest":%q,"size":%d,"annotations":{"org.opencontainers.image.ref.name":%q}}`, mediaType, digest, size, name)
	}
	good := entry(ManifestMediaType, digest, len(manifest), image)
	blob := "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:")
	layer := make([]byte, 2<<20)

	for _, tc := range []struct {
		name  string
		files map[string][]byte
		want  string // the digest, or what the error says
	}{
		{"one manifest", map[string][]byte{"index.json": index(good), blob: manifest, "blobs/sha256/layer": layer}, digest},
		{"no index", map[string][]byte{blob: manifest}, "no index.json"},
		{"two manifests", map[string][]byte{"index.json": index(good, good), blob: manifest}, "lists 2 manifests"},
		{"a docker manifest", map[string][]byte{"index.json": index(entry("application/vnd.docker.distribution.manifest.v2+json", digest, len(manifest), image)), blob: manifest}, "want an application/vnd.oci.image.manifest.v1+json"},
		{"another image", map[string][]byte{"index.json": index(entry(ManifestMediaType, digest, len(manifest), "ghcr.io/else/berth:v1")), blob: manifest}, "holds ghcr.io/else/berth:v1"},
		{"the manifest missing", map[string][]byte{"index.json": index(good)}, "is not in the archive"},
		{"other bytes under the digest", map[string][]byte{"index.json": index(good), blob: append(manifest, ' ')}, "is sha256:"},
		{"another size", map[string][]byte{"index.json": index(entry(ManifestMediaType, digest, len(manifest)+1, image)), blob: manifest}, "bytes) is"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			archive := writeTar(t, tc.files)
			got, err := ManifestDigest(archive, image)
			switch {
			case strings.HasPrefix(tc.want, "sha256:"):
				if err != nil || got != tc.want {
					t.Errorf("ManifestDigest = %q, %v; want %s", got, err, tc.want)
				}
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Errorf("ManifestDigest = %q, %v; want an error saying %q", got, err, tc.want)
			}
		})
	}
	notTar := filepath.Join(t.TempDir(), "image.oci.tar")
	if err := os.WriteFile(notTar, []byte("not a tar archive, but long enough to hold a header's worth of bytes"+strings.Repeat("x", 600)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ManifestDigest(notTar, image); err == nil {
		t.Error("ManifestDigest read a file that is no tar archive")
	}
}

func writeTar(t *testing.T, files map[string][]byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "image.oci.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := tar.NewWriter(f)
	for name, data := range files {
		if err := w.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}
