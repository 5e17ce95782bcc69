package hostconfig

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

// neutralPlatform is the only platform of neutralData, a config that shares no platform with
// any real file. It is put in force before each real file so that the file is judged on its
// own: Merge keeps the last good settings of a platform an edit breaks, so a platform listed
// bare in one file would stay usable if the file before had configured it (in sorted order it
// happens to linux-g6xlarge/amd64 in two production files and linux/s390x in the dev template).
const neutralPlatform = "berth-test/neutral"

var neutralData = map[string]string{"local-platforms": neutralPlatform}

// TestEveryRealConfigThroughTheWatcher: each real host-config ConfigMap, put in the watched
// ConfigMap, is applied by the running watcher with every platform usable except those it lists
// with no settings at all, and berth_platform_usable says the same.
//
// The Secrets the configs name are deliberately not created: the watcher only warns about a
// missing Secret (a SecretMissing Event, see checkSecrets), it never makes a platform unusable
// for it, so this also shows that an absent Secret costs no platform.
func TestEveryRealConfigThroughTheWatcher(t *testing.T) {
	files, err := realdata.HostConfigs()
	if err != nil {
		t.Fatal(err)
	}
	cm := watchedConfigMap(t)
	var ran, bare, usableDynamic int
	for _, f := range files {
		t.Run(f.Name, func(t *testing.T) {
			ran++
			putNeutral(t, cm)
			setData(t, cm, f.Data)
			// The neutral config is in force until the watcher judges this data; any config
			// without the neutral platform, or a rejection, is its judgement.
			eventually(t, "the watcher judges "+f.Name, func() bool {
				if rejected, _ := store.Rejected(); rejected != nil {
					return true
				}
				_, neutral := store.Config().Platforms[neutralPlatform]
				return !neutral
			})
			if _, problems := store.Rejected(); problems != nil {
				t.Fatalf("rejected as a whole: %s", problems.Summary())
			}
			cfg := store.Config()
			if got, want := slices.Sorted(maps.Keys(cfg.Platforms)), listedPlatforms(f.Data); !slices.Equal(got, want) {
				t.Fatalf("platforms in force:\n got %v\nwant %v (those the file lists)", got, want)
			}
			var unusable []config.Platform
			want := map[string]float64{}
			for _, r := range cfg.Report() {
				want[string(r.Platform)] = 1
				if !r.Usable {
					want[string(r.Platform)] = 0
					unusable = append(unusable, r.Platform)
				} else if r.Strategy == config.StrategyDynamic || r.Strategy == config.StrategyDynamicPool {
					usableDynamic++
				}
			}
			if wantBare := f.BareListed(); !slices.Equal(toStrings(unusable), wantBare) {
				t.Fatalf("unusable platforms %v, want exactly those listed without settings %v; problems:\n%s",
					unusable, wantBare, strings.ReplaceAll(cfg.Problems().Summary(), "; ", "\n"))
			}
			for _, p := range unusable {
				bare++
				if slices.ContainsFunc(slices.Collect(maps.Keys(f.Data)), func(k string) bool { return strings.HasPrefix(k, "dynamic."+p.Label()+".") }) {
					t.Errorf("%s has settings in the file, yet it is unusable: %s", p, cfg.Broken(p).Summary())
				}
			}

			// report() sets the gauges just after the config is put in force: wait until it has
			// replaced the neutral config's, then compare every platform.
			eventually(t, "berth_platform_usable names exactly this config's platforms", func() bool {
				return slices.Equal(slices.Sorted(maps.Keys(usableMetric(t))), slices.Sorted(maps.Keys(want)))
			})
			diff := metricDiff(usableMetric(t), want)
			eventually(t, "berth_platform_usable agrees with the config in force: "+diff, func() bool {
				return metricDiff(usableMetric(t), want) == ""
			})
		})
	}
	// Guards against a vacuous pass: the real files must exercise both sides of "except".
	if ran == len(files) && (bare == 0 || usableDynamic == 0) {
		t.Errorf("%d bare-listed and %d usable dynamic platforms over all real files: the test proves nothing", bare, usableDynamic)
	}
}

// watchedConfigMap returns the labelled ConfigMap the watcher judges, creating one when there is
// none, and restores the previous state when the test ends: the other tests create theirs and
// expect to find it alone.
func watchedConfigMap(t *testing.T) *corev1.ConfigMap {
	t.Helper()
	ctx := context.Background()
	var list corev1.ConfigMapList
	if err := cp.Client.List(ctx, &list, client.InNamespace(ns), client.HasLabels{ConfigLabel}); err != nil {
		t.Fatal(err)
	}
	switch len(list.Items) {
	case 0:
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "host-config", Namespace: ns, Labels: map[string]string{ConfigLabel: "hosts"}},
			Data:       maps.Clone(neutralData),
		}
		if err := cp.Client.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// The deleted ConfigMap's config stays in force: leave the neutral one, which no
			// other test's condition can mistake for its own.
			putNeutral(t, cm)
			if err := cp.Client.Delete(ctx, cm); err != nil {
				t.Error(err)
			}
		})
		return cm
	case 1:
		cm := &list.Items[0]
		before := maps.Clone(cm.Data)
		t.Cleanup(func() {
			putNeutral(t, cm)
			setData(t, cm, before)
			eventually(t, "the ConfigMap's own data is judged again", func() bool {
				if rejected, _ := store.Rejected(); rejected != nil {
					return true
				}
				_, neutral := store.Config().Platforms[neutralPlatform]
				return !neutral
			})
		})
		return cm
	}
	t.Fatalf("%d ConfigMaps carry %s; want at most one", len(list.Items), ConfigLabel)
	return nil
}

// putNeutral puts neutralData in force.
func putNeutral(t *testing.T, cm *corev1.ConfigMap) {
	t.Helper()
	setData(t, cm, neutralData)
	eventually(t, "the neutral config is in force", func() bool {
		cfg := store.Config()
		return cfg != nil && len(cfg.Platforms) == 1 && cfg.Usable(neutralPlatform)
	})
}

// setData replaces the ConfigMap's data.
func setData(t *testing.T, cm *corev1.ConfigMap, data map[string]string) {
	t.Helper()
	// The test may have written the ConfigMap meanwhile through another copy: start from the
	// stored one.
	if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(cm), cm); err != nil {
		t.Fatal(err)
	}
	cm.Data = maps.Clone(data)
	if err := cp.Client.Update(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
}

// listedPlatforms reads the platform names straight from the data: the three lists and the
// static hosts' platforms.
func listedPlatforms(data map[string]string) []config.Platform {
	set := map[config.Platform]bool{}
	for _, list := range []string{"local-platforms", "dynamic-platforms", "dynamic-pool-platforms"} {
		for _, name := range strings.Split(data[list], ",") {
			if name = strings.TrimSpace(name); name != "" {
				set[config.Platform(name)] = true
			}
		}
	}
	for k, v := range data {
		if strings.HasPrefix(k, "host.") && strings.HasSuffix(k, ".platform") {
			set[config.Platform(v)] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

func toStrings(ps []config.Platform) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p)
	}
	return out
}

// usableMetric reads berth_platform_usable, by platform.
func usableMetric(t *testing.T) map[string]float64 {
	t.Helper()
	ch := make(chan prometheus.Metric)
	go func() { platformUsable.Collect(ch); close(ch) }()
	out := map[string]float64{}
	var err error
	for m := range ch {
		var d dto.Metric
		if werr := m.Write(&d); werr != nil {
			err = werr
			continue
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == "platform" {
				out[l.GetValue()] = d.GetGauge().GetValue()
			}
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// metricDiff names each platform whose gauge differs from want; "" when none does.
func metricDiff(got, want map[string]float64) string {
	var diffs []string
	for _, p := range slices.Sorted(maps.Keys(want)) {
		if v, ok := got[p]; !ok || v != want[p] {
			diffs = append(diffs, fmt.Sprintf("%s=%v (want %v)", p, got[p], want[p]))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s=%v (not in the config)", p, got[p]))
		}
	}
	return strings.Join(diffs, ", ")
}
