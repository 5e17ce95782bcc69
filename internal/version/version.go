// Package version says which build of berth is running: the version and commit that make build
// and make image stamp into the binary, or, in a binary built otherwise, what Go recorded of it.
package version

import (
	"runtime"
	"runtime/debug"
)

// Set at link time by make build and make image (-ldflags "-X ...version=... -X ...commit=...",
// see the Makefile's LDFLAGS): the output of `git describe --tags --always --dirty` and of
// `git rev-parse HEAD`.
var (
	version string
	commit  string
)

// Devel is the version of a binary that carries neither a stamped version nor version-control
// information: go run, go test, or go build with -buildvcs=false.
const Devel = "devel"

// Unknown is the commit of such a binary.
const Unknown = "unknown"

// Info is what a berth binary says about itself.
type Info struct {
	// Version is what `git describe --tags --always --dirty` said at build time: the tag, or
	// on an untagged commit its short hash (2fc4508), with -dirty when tracked files had
	// uncommitted changes. Without a stamped version: see fromBuild.
	Version string
	// Commit is the full hash of the commit built, or Unknown.
	Commit string
	// GoVersion is the Go release that compiled the binary (go1.26.8).
	GoVersion string
	// Platform is GOOS/GOARCH (linux/amd64).
	Platform string
}

// Get returns this binary's Info.
func Get() Info {
	build, _ := debug.ReadBuildInfo()
	return fromBuild(version, commit, build)
}

// shortHash is as many hex digits of a commit as git prints for an untagged describe.
const shortHash = 7

// fromBuild fills what the linker flags left empty from the build information Go records
// (nil when there is none):
//   - go build in a git checkout records the commit (vcs.revision) and whether tracked files
//     had changes (vcs.modified): the version is then the short commit, with -dirty, as git
//     describe prints it for an untagged commit;
//   - go install of a tagged module version records that version (v1.2.0);
//   - go run, go test and builds with -buildvcs=false record neither: Devel and Unknown.
func fromBuild(version, commit string, build *debug.BuildInfo) Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	var revision string
	var modified bool
	if build != nil {
		for _, s := range build.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if info.Commit == "" {
		info.Commit = Unknown
		if revision != "" {
			info.Commit = revision
		}
	}
	if info.Version == "" {
		switch {
		case revision != "":
			info.Version = revision[:min(shortHash, len(revision))]
			if modified {
				info.Version += "-dirty"
			}
		case build != nil && build.Main.Version != "" && build.Main.Version != "(devel)":
			info.Version = build.Main.Version
		default:
			info.Version = Devel
		}
	}
	return info
}
