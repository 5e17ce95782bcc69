package tektonstandin

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// A step runs on the machine's own root filesystem, not its image's; what an image adds on
// top (berth's image adds `berth`) comes from Options.Images, which names a directory of
// this machine for an image reference. The directory's files are bound read-only into
// /usr/local/bin, which is on the PATH every step gets.

// imageBinDir is where a step finds the files of its image's directory.
const imageBinDir = "/usr/local/bin"

// imageRef is an image reference taken apart: name is the repository with its registry
// made explicit as a container runtime resolves it ("busybox" is
// docker.io/library/busybox), tag and digest are empty when absent.
type imageRef struct {
	name, tag, digest string
}

func parseImageRef(ref string) imageRef {
	var r imageRef
	ref, r.digest, _ = strings.Cut(ref, "@")
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		ref, r.tag = ref[:i], ref[i+1:]
	}
	if first, _, found := strings.Cut(ref, "/"); !found || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		ref = "docker.io/" + ref // the first part is a path, not a registry
	}
	if rest, ok := strings.CutPrefix(ref, "docker.io/"); ok && !strings.Contains(rest, "/") {
		ref = "docker.io/library/" + rest
	}
	r.name = ref
	return r
}

// imageMatch says how specifically key (an Options.Images reference) names image (a step's):
// 0 not at all. A key with a digest matches only that digest; a key with a tag matches that
// tag, whatever digest the step pins beside it (a step that names neither means :latest); a
// bare name matches every tag and digest of the repository.
func imageMatch(key, image imageRef) int {
	if key.name != image.name {
		return 0
	}
	switch {
	case key.digest != "":
		if key.digest == image.digest {
			return 3
		}
	case key.tag != "":
		tag := image.tag
		if tag == "" && image.digest == "" {
			tag = "latest"
		}
		if key.tag == tag {
			return 2
		}
	default:
		return 1
	}
	return 0
}

// imageDir is the directory Options.Images gives the step's image, the most specific match
// if several do; "" if none.
func (s *StandIn) imageDir(image string) string {
	want := parseImageRef(image)
	best, dir := 0, ""
	for key, d := range s.opts.Images {
		if m := imageMatch(parseImageRef(key), want); m > best || (m == best && m > 0 && d < dir) {
			best, dir = m, d
		}
	}
	return dir
}

// imageMounts binds the files of the step's image directory into imageBinDir; a step whose
// image has none gets nothing. Subdirectories are not bound: a container's /usr/local/bin
// holds programs.
func (s *StandIn) imageMounts(image string) ([]sandboxMount, error) {
	dir := s.imageDir(image)
	if dir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("the files of image %s: %w", image, err)
	}
	var mounts []sandboxMount
	for _, e := range entries {
		source := filepath.Join(dir, e.Name())
		if st, err := os.Stat(source); err != nil || !st.Mode().IsRegular() {
			continue
		}
		mounts = append(mounts, sandboxMount{source: source, target: filepath.Join(imageBinDir, e.Name()), readOnly: true})
	}
	return mounts, nil
}
