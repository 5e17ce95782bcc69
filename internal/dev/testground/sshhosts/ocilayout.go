package sshhosts

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Image is what the podman stand-in built, as read back from its OCI layout: what a test
// compares with the sources it synced and the user it expected.
type Image struct {
	// Digest is the manifest's, as the IMAGE_DIGEST result gives it.
	Digest string
	// Labels of the image config; the stand-in's own are io.berth.podman-standin.*.
	Labels map[string]string
	// Files are the regular files of all layers by path in the image (no leading /).
	Files map[string]ImageFile
	// Links are the symlinks, by path, to their targets.
	Links map[string]string
}

// ImageFile is a regular file in an image.
type ImageFile struct {
	Mode    fs.FileMode
	Content []byte
}

// ReadImageLayout reads the image named ref from the OCI layout in dir, checking each blob
// against its digest.
func ReadImageLayout(dir, ref string) (*Image, error) {
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := readJSON(filepath.Join(dir, "index.json"), &index); err != nil {
		return nil, err
	}
	img := &Image{Files: map[string]ImageFile{}, Links: map[string]string{}}
	var names []string
	for _, m := range index.Manifests {
		name := m.Annotations["org.opencontainers.image.ref.name"]
		names = append(names, name)
		if name == ref {
			img.Digest = m.Digest
		}
	}
	if img.Digest == "" {
		return nil, fmt.Errorf("%s has no image %q, only %q", dir, ref, names)
	}
	var manifest struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
		Layers []struct {
			MediaType string `json:"mediaType"`
			Digest    string `json:"digest"`
		} `json:"layers"`
	}
	if err := readBlobJSON(dir, img.Digest, &manifest); err != nil {
		return nil, err
	}
	var config struct {
		Config struct {
			Labels map[string]string `json:"Labels"`
		} `json:"config"`
	}
	if err := readBlobJSON(dir, manifest.Config.Digest, &config); err != nil {
		return nil, err
	}
	img.Labels = config.Config.Labels
	for _, layer := range manifest.Layers {
		data, err := readBlob(dir, layer.Digest)
		if err != nil {
			return nil, err
		}
		if err := img.addLayer(layer.MediaType, data); err != nil {
			return nil, fmt.Errorf("layer %s: %w", layer.Digest, err)
		}
	}
	return img, nil
}

func (img *Image) addLayer(mediaType string, data []byte) error {
	var r io.Reader = bytes.NewReader(data)
	switch {
	case strings.HasSuffix(mediaType, "+gzip"):
		gz, err := gzip.NewReader(r)
		if err != nil {
			return err
		}
		r = gz
	case strings.HasSuffix(mediaType, ".tar"):
	default:
		return fmt.Errorf("layer media type %q is not read here", mediaType)
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(filepath.Clean("/"+h.Name), "/")
		switch h.Typeflag {
		case tar.TypeReg:
			content, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			img.Files[name] = ImageFile{Mode: h.FileInfo().Mode(), Content: content}
		case tar.TypeSymlink:
			img.Links[name] = h.Linkname
		}
	}
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func readBlobJSON(dir, digest string, v any) error {
	data, err := readBlob(dir, digest)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("blob %s: %w", digest, err)
	}
	return nil
}

func readBlob(dir, digest string) ([]byte, error) {
	hexSum, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hexSum) != 64 || strings.Trim(hexSum, "0123456789abcdef") != "" {
		return nil, fmt.Errorf("digest %q is not sha256:<64 hex digits>", digest)
	}
	data, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", hexSum))
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != hexSum {
		return nil, fmt.Errorf("blob %s does not match its digest", digest)
	}
	return data, nil
}
