// Package ociarchive reads what a release pins from an image saved as an OCI archive (podman save
// --format oci-archive): the digest of its one image manifest. hack/release pins the install
// file's image by it, and the release test checks the pin against the archive `make release`
// leaves beside the file.
package ociarchive

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// ManifestMediaType is the only kind of image the archive may hold: a single-platform OCI
// manifest, as podman saves one.
const ManifestMediaType = "application/vnd.oci.image.manifest.v1+json"

var sha256Digest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ManifestDigest reads the archive's index.json and answers the digest of the one image
// manifest it lists, after checking that the manifest in the archive has that digest and size
// and, where the index names the image, that it names image. Pushed as it is, those manifest
// bytes are what a registry serves, so this is the digest to pin.
func ManifestDigest(archive, image string) (string, error) {
	small, err := smallFiles(archive)
	if err != nil {
		return "", fmt.Errorf("%s: %w", archive, err)
	}
	digest, err := manifestDigest(small, image)
	if err != nil {
		return "", fmt.Errorf("%s: %w", archive, err)
	}
	return digest, nil
}

// smallFiles reads the archive in one pass, keeping only the small files (index.json and the
// manifest): the layers are tens of MB.
func smallFiles(archive string) (map[string][]byte, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	small := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return small, nil
		}
		if err != nil {
			return nil, fmt.Errorf("not a tar archive: %w", err)
		}
		if h.Typeflag != tar.TypeReg || h.Size > 1<<20 {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		small[filepath.Clean(h.Name)] = data
	}
}

func manifestDigest(small map[string][]byte, image string) (string, error) {
	var index struct {
		Manifests []struct {
			MediaType   string            `json:"mediaType"`
			Digest      string            `json:"digest"`
			Size        int64             `json:"size"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	data, ok := small["index.json"]
	if !ok {
		return "", errors.New("no index.json: not an OCI archive (podman save --format oci-archive)")
	}
	if err := json.Unmarshal(data, &index); err != nil {
		return "", fmt.Errorf("index.json: %w", err)
	}
	if len(index.Manifests) != 1 {
		return "", fmt.Errorf("index.json lists %d manifests, want the one image's", len(index.Manifests))
	}
	m := index.Manifests[0]
	if m.MediaType != ManifestMediaType || !sha256Digest.MatchString(m.Digest) {
		return "", fmt.Errorf("index.json lists a %s of digest %q, want an %s with a sha256 digest", m.MediaType, m.Digest, ManifestMediaType)
	}
	if name, ok := m.Annotations["org.opencontainers.image.ref.name"]; ok && name != image {
		return "", fmt.Errorf("the archive holds %s, not %s", name, image)
	}
	blob, ok := small["blobs/sha256/"+strings.TrimPrefix(m.Digest, "sha256:")]
	if !ok {
		return "", fmt.Errorf("the manifest %s listed in index.json is not in the archive", m.Digest)
	}
	sum := sha256.Sum256(blob)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != m.Digest || int64(len(blob)) != m.Size {
		return "", fmt.Errorf("the manifest listed as %s (%d bytes) is %s (%d bytes)", m.Digest, m.Size, got, len(blob))
	}
	return m.Digest, nil
}
