package v1alpha1

import (
	"encoding/json"
	"testing"
	"time"
)

// A record written when these fields held whole seconds still reads, and a new one keeps the
// microseconds through a round trip.
func TestMicroTimeReadsOldAndNewRecords(t *testing.T) {
	var old AllocationStatus
	if err := json.Unmarshal([]byte(`{"reservedAt":"2026-11-23T17:04:41Z","readyAt":null}`), &old); err != nil {
		t.Fatalf("a whole-second record does not read: %v", err)
	}
	if want := time.Date(2026, 11, 23, 17, 4, 41, 0, time.UTC); !old.ReservedAt.Time.Equal(want) || old.ReadyAt != nil {
		t.Fatalf("read reservedAt %v readyAt %v, want %v and none", old.ReservedAt, old.ReadyAt, want)
	}

	at := time.Date(2026, 11, 23, 17, 4, 41, 123456789, time.UTC)
	stamp := NewMicroTime(at)
	data, err := json.Marshal(AllocationStatus{ReadyAt: &stamp})
	if err != nil {
		t.Fatal(err)
	}
	var back AllocationStatus
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if want := at.Truncate(time.Microsecond); !back.ReadyAt.Time.Equal(want) {
		t.Fatalf("%s read back as %v, want %v", data, back.ReadyAt.Time, want)
	}
}
