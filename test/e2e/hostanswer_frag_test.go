package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// ipFragment builds one IP fragment (IPv4 header, or IPv6 header and
// fragment header) of a UDP datagram with the given ID, offset in bytes
// and more-fragments flag, as a sender with CAP_NET_RAW picks them.
func ipFragment(src, dst netip.Addr, id uint32, off int, mf bool, payload []byte) []byte {
	fo := uint16(off / 8)
	if src.Is4() {
		b := make([]byte, 20, 20+len(payload))
		b[0], b[8], b[9] = 0x45, 64, 17
		binary.BigEndian.PutUint16(b[2:4], uint16(20+len(payload)))
		binary.BigEndian.PutUint16(b[4:6], uint16(id))
		if mf {
			fo |= 0x2000
		}
		binary.BigEndian.PutUint16(b[6:8], fo)
		s, d := src.As4(), dst.As4()
		copy(b[12:16], s[:])
		copy(b[16:20], d[:])
		binary.BigEndian.PutUint16(b[10:12], icmpChecksum(b[:20]))
		return append(b, payload...)
	}
	b := make([]byte, 48, 48+len(payload))
	b[0], b[6], b[7] = 0x60, 44, 64
	binary.BigEndian.PutUint16(b[4:6], uint16(8+len(payload)))
	s, d := src.As16(), dst.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
	b[40] = 17
	fo <<= 3
	if mf {
		fo |= 1
	}
	binary.BigEndian.PutUint16(b[42:44], fo)
	binary.BigEndian.PutUint32(b[44:48], id)
	return append(b, payload...)
}

// fragOf reads an Ethernet frame: its IP source and, when it is a
// fragment, its ID.
func fragOf(f []byte) (src netip.Addr, id uint32, frag bool) {
	if len(f) < 14 {
		return
	}
	switch binary.BigEndian.Uint16(f[12:14]) {
	case 0x0800:
		if len(f) < 34 {
			return
		}
		src = netip.AddrFrom4([4]byte(f[26:30]))
		return src, uint32(binary.BigEndian.Uint16(f[18:20])), binary.BigEndian.Uint16(f[20:22])&0x3fff != 0
	case 0x86dd:
		if len(f) < 62 {
			return
		}
		src = netip.AddrFrom16([16]byte(f[22:38]))
		return src, binary.BigEndian.Uint32(f[58:62]), f[20] == 44
	}
	return
}

// TestHostAnswerFragmentIDFromPod (review rev18, F1): a LoadBalancer VIP
// whose endpoint is a UDP server in n2's own stack (a hostNetwork pod's
// node-local DNS, say) answers an outside client with datagrams larger
// than the MTU; n2's host_answer records the answer's first fragment to
// give its later fragments the VIP as their source. A pod on n2 then
// sends that client a fragmented datagram with the answer's IP ID (a pod
// with CAP_NET_RAW picks it; here the test's raw socket in the pod's
// namespace), which from_pod SNATs to n2's address. Its later fragment
// (payload the pod chose) must reach the client from n2's address, not
// from the other tenant's VIP; before, host_answer took the answer's
// record for it. IPv4; the honest fragmented answers are echoed in full
// throughout.
func TestHostAnswerFragmentIDFromPod(t *testing.T) {
	needLab(t)
	lbClass(t, "e2e-haf", "172.30.0.228/31", "fd00:30::e4/127")
	pods := semStart(t, hostnetPod("haf-host", "haf", "n2", 18490), semPod("haf-pod", "haf-pod", "n2"))
	const port = 18492
	n2 := netutil.Path(labConfig().NetNS("n2"))
	bigUDPEcho(t, n2, port)
	svc := semService(t, "haf", "haf", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerClass = ptr.To(lacev1.LoadBalancerClassPrefix + "e2e-haf")
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(port), Protocol: corev1.ProtocolUDP}}
	})
	waitEndpoints(t, svc, 1)
	vips := waitIngress(t, "haf", 2)
	ext := externalNS()
	extV4, extV6 := lab.ExternalUnderlay()
	podNS := podNetNS(t, pods["haf-pod"])
	pod4, pod6 := podAddrs(pods["haf-pod"])
	marker := []byte("FORGED-BY-A-POD!")
	for _, vip := range vips {
		// IPv4 only here: its 16-bit ID is what a pod can spray; an
		// IPv6 ID is 32 bits, not guessed blind. Both families are held
		// by PROG_RUN (TestHostAnswerFragmentIDReuse).
		v4 := vip.Is4()
		if !v4 {
			continue
		}
		extA, podA := extV6, pod6
		if v4 {
			extA, podA = extV4, pod4
		}
		t.Run(vip.String(), func(t *testing.T) {
			eventually(t, 30*time.Second, vip.String()+" announced by n2", func() error {
				if who := announcers(t, vip); len(who) != 1 || who[0] != "n2" {
					return fmt.Errorf("announced by %v", who)
				}
				return nil
			})
			dst := netip.AddrPortFrom(vip, 53)
			eventually(t, 30*time.Second, fmt.Sprintf("%d-byte UDP to %s echoed in full", bigUDP, dst), func() error {
				return bigExchange(ext, dst)
			})
			// The answer's fragments as the client sees them: from the
			// VIP, with the ID n2's stack chose.
			var exErr error
			frames, err := netutil.Capture(ext, "eth0", func() { exErr = bigExchange(ext, dst) })
			if err != nil || exErr != nil {
				t.Fatalf("capture an answer: %v, exchange: %v", err, exErr)
			}
			var id uint32
			var seen bool
			for _, f := range frames {
				if src, fid, frag := fragOf(f); frag && src == vip {
					id, seen = fid, true
				}
			}
			if !seen {
				t.Fatalf("no fragment of the answer from %s among %d frames", vip, len(frames))
			}
			// Within the record's 10 s: the pod's datagram to the client
			// with that ID, first fragment then a later one.
			first := append(make([]byte, 8), bytes.Repeat([]byte{'x'}, 24)...)
			binary.BigEndian.PutUint16(first[0:2], 41000)
			binary.BigEndian.PutUint16(first[2:4], 9999)
			binary.BigEndian.PutUint16(first[4:6], uint16(8+24+len(marker)))
			frames, err = netutil.Capture(ext, "eth0", func() {
				rawSend(t, podNS, extA, ipFragment(podA, extA, id, 0, true, first), ipFragment(podA, extA, id, 32, false, marker))
				time.Sleep(500 * time.Millisecond) // the capture's window: both fragments cross two hops
			})
			if err != nil {
				t.Fatal(err)
			}
			node := nodeAddr(2, v4)
			var got []netip.Addr
			for _, f := range frames {
				if src, fid, frag := fragOf(f); frag && fid == id && bytes.Contains(f, marker) {
					got = append(got, src)
				}
			}
			if len(got) == 0 {
				t.Fatalf("the pod's later fragment (ID %#x) never reached the client", id)
			}
			for _, src := range got {
				if src != node {
					t.Errorf("the pod's SNAT later fragment (ID %#x) reached the client from %s (the VIP: another tenant's address), want n2's %s", id, src, node)
				}
			}
			// The honest answers still leave whole from the VIP.
			if err := bigExchange(ext, dst); err != nil {
				t.Errorf("after the pod's fragments: %v", err)
			}
		})
	}
}
