package devstack

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestQuietPortIsBelowTheOutgoingRange: the webhook's port is one no outgoing connection can be
// given while it stands unbound, and free when picked.
func TestQuietPortIsBelowTheOutgoingRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip("no /proc/sys/net/ipv4/ip_local_port_range here")
	}
	low, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		port, err := quietPort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if low-10000 >= 1000 && (port < 10000 || port >= low) {
			t.Fatalf("port %d is not below the outgoing range starting at %d", port, low)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("the picked port %d is not free: %v", port, err)
		}
		_ = ln.Close()
	}
}
