package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

// VM platforms: the scenario's platform is dynamic (or dynamic-pool), of type local-vm, on a
// local VM cloud that runs in the bench process, so that killing the controller never stops
// it. Its VMs are real SSH hosts (sshhosts), so the controller logs in, creates and removes
// build users as on any VM.

const (
	// cloudSecret holds the cloud's API key (key api-key) in the controller's namespace.
	cloudSecret = "vm-cloud-credentials"
	// poolMaxAgeMinutes is long enough that max-age never retires a pool VM during a run.
	poolMaxAgeMinutes = 120
	// allocationTimeoutSeconds is generous: a task waits for a VM of a busy platform behind
	// hundreds of others, and the bench measures that wait rather than ending it.
	allocationTimeoutSeconds = 3600
	// settleLimit bounds the wait, after the last task, for the controller to end the VMs it
	// should end before leaks are counted.
	settleLimit = 2 * time.Minute
)

// VMResult is what a run on a VM platform measured of the fleet. Its fields sit at the top
// level of a Result's JSON; runs on static hosts have none of them.
type VMResult struct {
	MaxInstances int `json:"maxInstances"`
	// InstancesLaunched is the cloud's count of instances created.
	InstancesLaunched int `json:"instancesLaunched"`
	// PeakInstances is the most instances up (pending or running) at once.
	PeakInstances int `json:"peakInstances"`
	// MaxInstancesExceeded counts launches that took the platform above max-instances.
	MaxInstancesExceeded int `json:"maxInstancesExceeded"`
	// LeakedInstances are up after the run and the settle period while the controller does
	// not account for them (see leakedInstances); Leaks says what each is.
	LeakedInstances int      `json:"leakedInstances"`
	Leaks           []string `json:"leaks,omitempty"`
	// InstancesUpAfter are up at the end, leaks or not (a pool keeps its VMs until max-age).
	InstancesUpAfter int `json:"instancesUpAfter"`
	// SettleSeconds is how long the controller took to reach no leaks after the last task
	// (settleLimit when it never did).
	SettleSeconds float64 `json:"settleSeconds"`
	// DoubleLaunches are instances that should not exist beside another (see doubleLaunches).
	DoubleLaunches int `json:"doubleLaunches"`
	// SingleUseReused counts single-use VMs that were assigned more than one task.
	SingleUseReused int `json:"singleUseVmsReused"`
	// ReadyToSecret is from the cloud's instance becoming running to the first secret of a
	// task assigned to it; ReadyToSecretFrom says so in the JSON.
	ReadyToSecret     Percentiles `json:"vmReadyToSecretMs"`
	ReadyToSecretFrom string      `json:"vmReadyToSecretFrom"`
}

// startCloud starts the local VM cloud whose VMs accept admin, logging to logPath. It returns
// the cloud, the API key berth must present, and how to stop the cloud and every VM.
func startCloud(admin ssh.Signer, logPath string) (*vmcloud.Cloud, string, func() error, error) {
	if err := sshhosts.Prerequisites(); err != nil {
		return nil, "", nil, fmt.Errorf("VM scenarios run real SSH hosts: %w", err)
	}
	key := make([]byte, 16)
	if _, err := rand.Read(key); err != nil {
		return nil, "", nil, err
	}
	apiKey := hex.EncodeToString(key)
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, "", nil, err
	}
	cloud, err := vmcloud.New(vmcloud.Options{Admin: admin, APIKey: apiKey,
		Logf: func(format string, args ...any) {
			fmt.Fprintf(logFile, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
		}})
	if err != nil {
		logFile.Close()
		return nil, "", nil, err
	}
	stop := func() error {
		err := cloud.Close()
		logFile.Close()
		return err
	}
	return cloud, apiKey, stop, nil
}

// addVMPlatform makes the scenario's platform a dynamic (or dynamic-pool) platform of type
// local-vm on the cloud at endpoint.
func addVMPlatform(data map[string]string, sc Scenario, endpoint string) {
	list := "dynamic-platforms"
	if sc.Pooled {
		list = "dynamic-pool-platforms"
	}
	data[list] = benchPlatform
	p := "dynamic." + strings.ReplaceAll(benchPlatform, "/", "-") + "."
	data[p+"type"] = "local-vm"
	data[p+"endpoint"] = endpoint
	data[p+"secret"] = cloudSecret
	data[p+"ssh-secret"] = adminSecret
	data[p+"max-instances"] = strconv.Itoa(sc.MaxInstances)
	data[p+"check-interval"] = "1"
	data[p+"allocation-timeout"] = strconv.Itoa(allocationTimeoutSeconds)
	if sc.Pooled {
		data[p+"concurrency"] = strconv.Itoa(sc.Concurrency)
		data[p+"max-age"] = strconv.Itoa(poolMaxAgeMinutes)
	}
}

// maxAge is how long a VM of the scenario may take tasks (0: as long as it is wanted).
func (sc Scenario) maxAge() time.Duration {
	if sc.Pooled {
		return poolMaxAgeMinutes * time.Minute
	}
	return 0
}

// vmRecords lists the controller's VM records.
func vmRecords(ctx context.Context, c client.Client) ([]vmRecord, error) {
	var list berthv1.BuildHostList
	if err := c.List(ctx, &list, client.InNamespace(controllerNamespace)); err != nil {
		return nil, err
	}
	var out []vmRecord
	for _, bh := range list.Items {
		in := bh.Spec.Instance
		if in == nil {
			continue
		}
		r := vmRecord{Name: bh.Name, Retired: in.Retire != ""}
		if st := bh.Status.Instance; st != nil {
			r.InstanceID = st.ID
			if st.ReadyAt != nil {
				r.ReadyAt = st.ReadyAt.Time
			}
			r.Retired = r.Retired || st.Phase == berthv1.InstanceTerminating
		}
		out = append(out, r)
	}
	return out, nil
}

// settleVMs waits, up to settleLimit, until no instance is a leak, and then judges the fleet.
func settleVMs(ctx context.Context, c client.Client, cloud *vmcloud.Cloud, sc Scenario, chk *hostChecker, secretAt func() map[string]time.Time) (*VMResult, error) {
	start := time.Now()
	var leaks []string
	err := poll(ctx, settleLimit, 250*time.Millisecond, func() bool {
		records, err := vmRecords(ctx, c)
		if err != nil {
			return false
		}
		leaks = leakedInstances(cloud.Instances(), records, sc.maxAge(), time.Now())
		return len(leaks) == 0
	})
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	instances := cloud.Instances()
	res := &VMResult{MaxInstances: sc.MaxInstances, InstancesLaunched: cloud.LaunchCount(),
		LeakedInstances: len(leaks), Leaks: leaks, SettleSeconds: time.Since(start).Seconds(),
		DoubleLaunches:    doubleLaunches(instances),
		ReadyToSecretFrom: "the cloud's instance running (its sshd answering) → the first secret of a task assigned to it",
	}
	res.PeakInstances, res.MaxInstancesExceeded = instancePeak(instances, sc.MaxInstances)
	for _, inst := range instances {
		if inst.State != vmcloud.Gone && !inst.Vanished {
			res.InstancesUpAfter++
		}
	}
	tasksOn := chk.assignments()
	if !sc.Pooled {
		for _, tasks := range tasksOn {
			if len(tasks) > 1 {
				res.SingleUseReused++
			}
		}
	}
	res.ReadyToSecret = percentiles(readyToSecret(instances, tasksOn, secretAt()))
	return res, nil
}
