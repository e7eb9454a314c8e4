package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// icmp4FragNeeded is an ICMP fragmentation needed with next-hop MTU mtu,
// quoting quote.
func icmp4FragNeeded(mtu uint16, quote []byte) []byte {
	b := append([]byte{3, 4, 0, 0, 0, 0, byte(mtu >> 8), byte(mtu)}, quote...)
	binary.BigEndian.PutUint16(b[2:4], icmpChecksum(b))
	return b
}

// routeMTU is the path MTU the namespace at nsPath holds for dst (0: none
// learnt, the link's).
func routeMTU(t *testing.T, nsPath string, dst netip.Addr) int {
	t.Helper()
	h, err := netutil.Handle(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	routes, err := h.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		t.Fatalf("route to %s in %s: %v", dst, nsPath, err)
	}
	return routes[0].MTU
}

// TestICMPErrorsInTiedToPeer: pod A (n1) holds a UDP flow with pod B (n2)
// of its network, which the world may also reach. The external host, on
// the fabric, sends A fragmentation needed (MTU 576) and port unreachable
// quoting A's packet to B: n1 drops both (icmp-error-in-no-flow), A's path
// MTU toward B stays what it was and its connected socket keeps talking to
// B. B's own port unreachable about the same flow is delivered: A's socket
// reports the refusal. Before, the fabric host's errors reached A, whose
// kernel lowered the path MTU to 576 and failed the socket with
// ECONNREFUSED.
func TestICMPErrorsInTiedToPeer(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	network(t, c, "icmpin-p", "10.137.0.0/16", "fd00:137::/48", false)
	labelNetwork(t, c, "icmpin-p", map[string]string{"e2e-icmpin": "p"})
	routingPolicy(t, c, "e2e-world-to-icmpin-p", map[string]string{"lace-cni.io/network": "world"}, map[string]string{"e2e-icmpin": "p"})
	a := netPod(t, "icmpin-a", "icmpin-p", "n1", true)
	b := netPod(t, "icmpin-b", "icmpin-p", "n2", true)
	aV4, _ := podAddrs(a)
	bV4, _ := podAddrs(b)
	aNS, bNS := podNetNS(t, a), podNetNS(t, b)
	ext := externalNS()
	extV4, _ := lab.ExternalUnderlay()
	n1v4, _ := lab.NodeUnderlay(1)
	host := netip.PrefixFrom(aV4, 32)
	if err := netutil.EnsureRoute(ext, host, n1v4, "eth0"); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = netutil.DeleteRoute(ext, host, "eth0") }()

	u, err := netutil.DialContext(context.Background(), aNS, "udp", net.JoinHostPort(bV4.String(), "8081"))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	ask := func() error {
		if _, err := u.Write([]byte("hostname")); err != nil {
			return err
		}
		_ = u.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 256)
		n, err := u.Read(buf)
		if err == nil && string(buf[:n]) != b.Name {
			return fmt.Errorf("answered %q", buf[:n])
		}
		return err
	}
	eventually(t, 20*time.Second, "A's UDP flow to B", ask)
	lport := uint16(u.LocalAddr().(*net.UDPAddr).Port)
	mtuBefore := routeMTU(t, aNS, bV4)
	quote := ip4Packet(aV4, bV4, 17, udpDatagram(lport, 8081, "hostname"))[:28]

	before := nodeDrops(t, "n1")
	rawSend(t, ext, aV4,
		ip4Packet(extV4, aV4, 1, icmp4FragNeeded(576, quote)),
		ip4Packet(extV4, aV4, 1, icmp4Unreach(quote)))
	// Counted within 5 s (not fatal: what the errors did to A is checked
	// either way).
	var got uint64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if got = nodeDrops(t, "n1")["icmp-error-in-no-flow"] - before["icmp-error-in-no-flow"]; got >= 2 {
			break
		}
	}
	if got < 2 {
		t.Errorf("n1 counted %d as icmp-error-in-no-flow, want the 2 sent", got)
	}
	if got := routeMTU(t, aNS, bV4); got != mtuBefore {
		t.Errorf("A's path MTU toward B is %d after the fabric host's fragmentation needed, was %d", got, mtuBefore)
	}
	if err := ask(); err != nil {
		t.Errorf("A's flow to B after the fabric host's port unreachable: %v", err)
	}

	// B's own error about the flow: A's socket learns of it.
	sendICMP(t, bNS, aV4, icmp4Unreach(quote))
	eventually(t, 5*time.Second, "B's port unreachable reaches A", func() error {
		err := ask()
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		return fmt.Errorf("A's socket: %v, want connection refused", err)
	})
}
