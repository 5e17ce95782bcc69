package bench

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestExecutableOf(t *testing.T) {
	for command, want := range map[string]string{
		"bin/berth controller --x=1":                   "bin/berth",
		"env GOGC=50 bin/berth controller":             "bin/berth",
		"GODEBUG=gctrace=1 upstream --metrics=0":       "upstream",
		"exec env A=1 B=2 ./controller --leader-elect": "./controller",
	} {
		if got := executableOf(command); got != want {
			t.Errorf("executableOf(%q) = %q, want %q", command, got, want)
		}
	}
}

// residentPages counts the pages of the file in the page cache (mincore of a mapping of it).
func residentPages(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	pages := (len(m) + os.Getpagesize() - 1) / os.Getpagesize()
	vec := make([]byte, pages)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

func TestEvictExecutableDropsItsPagesFromThePageCache(t *testing.T) {
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		// tmpfs pages live only in the page cache and cannot be dropped: use the checkout's disk.
		wd, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		if dir, err = os.MkdirTemp(wd, "coldstart-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	path := filepath.Join(dir, "controller")
	// Written just now: all its pages are in the page cache, dirty.
	if err := os.WriteFile(path, make([]byte, 4<<20), 0o755); err != nil {
		t.Fatal(err)
	}
	before := residentPages(t, path)
	if before == 0 {
		t.Fatal("a file just written has no page in the page cache: the check below could not fail")
	}
	if err := evictExecutable("env GOGC=50 " + path + " controller --flag"); err != nil {
		t.Fatal(err)
	}
	if after := residentPages(t, path); after != 0 {
		t.Fatalf("%d of its %d pages still in the page cache after evictExecutable, want 0", after, before)
	}
}
