package netutil

import (
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestKeepResolved: a managed next hop is resolved by the kernel on its
// own (no packet sent to it); an operator's static entry for a next hop,
// wanted or not, is left as it is; Lace's entry goes when its next hop is
// no longer wanted.
func TestKeepResolved(t *testing.T) {
	node, peer := testNS(t, "lkra"), testNS(t, "lkrb")
	hop, other := netip.MustParseAddr("fd00:77::9"), netip.MustParseAddr("fd00:77::8")
	var peerMAC net.HardwareAddr
	err := Do(Path(node), func() error {
		la := netlink.NewLinkAttrs()
		la.Name = "ul"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "ulpeer"}); err != nil {
			return err
		}
		p, err := netlink.LinkByName("ulpeer")
		if err != nil {
			return err
		}
		f, err := os.Open(Path(peer))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := netlink.LinkSetNsFd(p, int(f.Fd())); err != nil {
			return err
		}
		l, err := netlink.LinkByName("ul")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("fd00:77::1/64")
		addr.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
		// An entry of the operator's, for a next hop Lace wants too: never
		// Lace's to change or remove.
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_INET6, IP: other.AsSlice(),
			State: netlink.NUD_PERMANENT, HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 8}}); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err == nil {
		err = Do(Path(peer), func() error {
			l, err := netlink.LinkByName("ulpeer")
			if err != nil {
				return err
			}
			peerMAC = l.Attrs().HardwareAddr
			addr, _ := netlink.ParseAddr(hop.String() + "/64")
			addr.Flags = unix.IFA_F_NODAD
			if err := netlink.AddrAdd(l, addr); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	entries := func() map[netip.Addr]netlink.Neigh {
		out := map[netip.Addr]netlink.Neigh{}
		err := Do(Path(node), func() error {
			l, err := netlink.LinkByName("ul")
			if err != nil {
				return err
			}
			list, err := netlink.NeighList(l.Attrs().Index, unix.AF_INET6)
			for _, n := range list {
				if a, ok := netip.AddrFromSlice(n.IP); ok {
					out[a] = n
				}
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	var k NeighKeeper
	keep := func(want []netip.Addr) error {
		n, err := OpenNS(Path(node))
		if err != nil {
			return err
		}
		defer n.Close()
		return k.Keep(n, "ul", want)
	}
	if err := keep([]netip.Addr{hop, other}); err != nil {
		t.Fatal(err)
	}
	if n := entries()[other]; n.State != netlink.NUD_PERMANENT || n.FlagsExt&netlink.NTF_EXT_MANAGED != 0 {
		t.Errorf("the operator's static entry for wanted next hop %s was taken over: %+v", other, n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, ok := entries()[hop]
		if ok && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE) != 0 && n.HardwareAddr.String() == peerMAC.String() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("managed next hop %s not resolved to %s: %+v", hop, peerMAC, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Idempotent: a second call leaves the resolved entry as it is.
	if err := keep([]netip.Addr{hop, other}); err != nil {
		t.Fatal(err)
	}
	if n := entries()[hop]; n.HardwareAddr.String() != peerMAC.String() {
		t.Errorf("a second call reset the resolved entry: %+v", n)
	}
	if err := keep(nil); err != nil {
		t.Fatal(err)
	}
	got := entries()
	if n, ok := got[hop]; ok && n.FlagsExt&netlink.NTF_EXT_MANAGED != 0 {
		t.Errorf("Lace's managed entry for %s stayed: %+v", hop, n)
	}
	if n, ok := got[other]; !ok || n.State != netlink.NUD_PERMANENT {
		t.Errorf("the operator's entry for %s was touched: %+v (present %v)", other, n, ok)
	}
}
