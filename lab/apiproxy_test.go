package lab

import (
	"net/netip"
	"testing"
)

// The egress proxy dials kubelets from the fabric and pods from the
// external namespace, and nothing else: not the machine's loopback, not a
// Service VIP, not the external host's served ranges, not the Internet.
func TestEgressFrom(t *testing.T) {
	n1v4, n1v6 := NodeUnderlay(1)
	for _, tc := range []struct {
		dst, from string
	}{
		{n1v4.String(), "fabric"},
		{n1v6.String(), "fabric"},
		{"::ffff:" + n1v4.String(), "fabric"},
		{"10.244.1.7", "external"},    // the chart's default network
		{"10.42.0.3", "external"},     // a test's network elsewhere in 10/8
		{"fd00:244::1:7", "external"}, // its IPv6 side
		{"10.96.0.10", ""},            // kube-dns's VIP
		{"fd00:96::a", ""},
		{"127.0.0.1", ""},
		{"::1", ""},
		{"198.51.100.10", ""}, // ExternalServedAddrs
		{"2001:db8:51::10", ""},
		{"172.30.1.1", ""}, // beside the fabric
		{"8.8.8.8", ""},
		{"2001:4860::8888", ""},
	} {
		if got := egressFrom(netip.MustParseAddr(tc.dst)); got != tc.from {
			t.Errorf("egressFrom(%s) = %q, want %q", tc.dst, got, tc.from)
		}
	}
}
