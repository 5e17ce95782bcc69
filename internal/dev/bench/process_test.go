package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

func TestParseResident(t *testing.T) {
	const status = "Name:\tberth\nVmPeak:\t 2000000 kB\nVmHWM:\t   90000 kB\nVmRSS:\t   81000 kB\n" +
		"RssAnon:\t   30000 kB\nRssFile:\t   50500 kB\nRssShmem:\t     500 kB\nThreads:\t12\n"
	rs, ok := parseResident([]byte(status))
	if !ok || rs != (residentSet{total: 81000, anon: 30000, file: 50500}) {
		t.Errorf("parseResident = %+v, %v; want total 81000, anon 30000, file 50500", rs, ok)
	}
	if hwm, ok := statusKiB([]byte(status), "VmHWM:"); !ok || hwm[0] != 90000 {
		t.Errorf("statusKiB(VmHWM) = %v, %v; want 90000", hwm, ok)
	}
	for name, text := range map[string]string{
		"no RssFile (a kernel before 4.5)": "VmRSS:\t 81000 kB\nRssAnon:\t 30000 kB\n",
		"an exited process":                "",
		"a number that is not one":         "VmRSS:\t x kB\nRssAnon:\t 30000 kB\nRssFile:\t 50500 kB\n",
	} {
		if rs, ok := parseResident([]byte(text)); ok {
			t.Errorf("%s: parseResident = %+v, true; want false", name, rs)
		}
	}
}

// The sampler keeps the split of the highest resident set of the process it watches, as the
// kernel splits it. A process that sleeps stops growing once its loader is done: the sampled
// split then is the process's.
func TestTheResidentSetIsSampledByKind(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); close(exited) }()
	var p controllerProcess
	go p.sampleResident(cmd.Process.Pid, exited)
	statusPath := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/status"
	var sampled, now residentSet
	eventually(t, "the sampled resident set is the sleeping process's", func() bool {
		status, err := os.ReadFile(statusPath)
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		if now, ok = parseResident(status); !ok {
			t.Fatalf("no resident set in the status of the sleeping process:\n%s", status)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		sampled = p.resident
		// Right after the fork, before sleep is executed, the child holds a few anonymous
		// pages and none of a file: both reads may land there and agree.
		return sampled == now && now.file > 0
	})
	if sampled.anon == 0 || sampled.file == 0 || sampled.anon+sampled.file > sampled.total {
		t.Errorf("sampled %+v KiB: want anonymous and file-backed pages, adding up to at most the whole", sampled)
	}
}

// The bench's controller process is sampled from its start, and its usage carries the split.
func TestTheControllersUsageCarriesTheSplit(t *testing.T) {
	p, err := startController("sleep 60", "", filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	var u usage
	eventually(t, "a sample of the controller's resident set", func() bool { u = p.usage(); return u.peakFileMiB > 0 })
	if u.peakAnonMiB == 0 || u.peakFileMiB == 0 || u.peakAnonMiB+u.peakFileMiB > u.peakRSSMiB {
		t.Errorf("usage: peak %.3f MiB, of it anonymous %.3f and file-backed %.3f: want both, within the peak",
			u.peakRSSMiB, u.peakAnonMiB, u.peakFileMiB)
	}
}
