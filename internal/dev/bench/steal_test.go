package bench

import "testing"

func TestParseStealReadsTheMachinesTotal(t *testing.T) {
	// Two processors; the machine's line first, then one line per processor.
	stat := []byte("cpu  10132153 290696 3084719 46828483 16683 0 25195 1534 0 0\n" +
		"cpu0 5066076 145348 1542359 23414241 8341 0 12597 767 0 0\n" +
		"cpu1 5066077 145348 1542360 23414242 8342 0 12598 767 0 0\n" +
		"intr 1462898 0 0\n")
	got, ok := parseSteal(stat)
	if !ok || got != 15.34 {
		t.Fatalf("parseSteal = %v, %v; want 15.34 s (1534 ticks), true", got, ok)
	}
	for _, bad := range []string{
		"",
		"cpu0 1 2 3 4 5 6 7 8\n",        // a processor's line, not the machine's
		"cpu  1 2 3 4 5 6 7\n",          // a kernel without the steal field
		"cpu  1 2 3 4 5 6 7 lots 0 0\n", // not a number
		"intr 1 2 3 4 5 6 7 8 9\ncpu  1 2 3 4 5 6 7 8\n",
	} {
		if got, ok := parseSteal([]byte(bad)); ok {
			t.Errorf("parseSteal(%q) = %v, true; want false", bad, got)
		}
	}
}
