package model

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// The annotations the model reads are written by users (or by other
// controllers) and reach it unchecked: each target feeds one arbitrary
// strings and checks it is used as docs/ say, or ignored, never in part.

// FuzzLoadBalancerIPsAnnotation: lace-cni.io/load-balancer-ips (else
// spec.loadBalancerIP) asks for one address per family. A request with
// an entry that is no address, of a family the Service lacks, or a
// second of a family gets the Service no address at all; otherwise every
// family asked for gets exactly the address asked for (or none, when it
// is outside the pool or held by an older Service), every other family
// a free one, and every address handed out is a plain address of the
// pool.
func FuzzLoadBalancerIPsAnnotation(f *testing.F) {
	for _, s := range []struct {
		ann, lbIP string
		dual      bool
	}{
		{"192.0.2.3", "", false}, {"192.0.2.3, 2001:db8::3", "", true}, {" 2001:db8::3 ,192.0.2.3 ,", "", true},
		{"192.0.2.3,192.0.2.4", "", true}, {"2001:db8::3", "", false}, {"192.0.2.5", "", false}, {"198.51.100.1", "", false},
		{"not-an-ip", "", true}, {"", "192.0.2.9", false}, {" ", "192.0.2.9", false}, {",", "192.0.2.9", false},
		// A zone in the pool's range was handed out as the VIP.
		{"::ffff:192.0.2.3", "", false}, {"2001:db8::3%eth0", "", true}, {"192.0.2.3/32", "", false}, {"", "", true},
		{"192.0.2.0", "", false}, {"192.0.2.15", "", false}, {"2001:db8::", "", true}, {"2001:db8::f", "", true},
	} {
		f.Add(s.ann, s.lbIP, s.dual)
	}
	pool := lbPool("pool", true, "192.0.2.0/28", "2001:db8::/124")
	// The /28 without its network and broadcast addresses, the /124
	// without its subnet-router anycast address (load-balancers.md).
	inPool := func(a netip.Addr) bool {
		in := func(first, last string) bool {
			return a.Compare(netip.MustParseAddr(first)) >= 0 && a.Compare(netip.MustParseAddr(last)) <= 0
		}
		return a.Zone() == "" && (in("192.0.2.1", "192.0.2.14") || in("2001:db8::1", "2001:db8::f"))
	}
	f.Fuzz(func(t *testing.T, ann, lbIP string, dual bool) {
		fams := v4only
		if dual {
			fams = v6v4
		}
		// An older Service holds 192.0.2.5: asking for it is a conflict.
		old := lbSvc("old", 1, nil, v4only, "192.0.2.5")
		s := lbSvc("s", 2, nil, fams)
		s.Spec.LoadBalancerIP = lbIP
		if ann != "" {
			s.Annotations = map[string]string{lacev1.AnnotationLoadBalancerIPs: ann}
		}
		res := AllocateLoadBalancers([]lacev1.LoadBalancerClass{pool}, []corev1.Service{old, s}, nil, LBAvoid{})
		st := res.Services["ns/s"]

		asked := []string{}
		if strings.TrimSpace(ann) != "" {
			for _, f := range strings.Split(ann, ",") {
				if f = strings.TrimSpace(f); f != "" {
					asked = append(asked, f)
				}
			}
		} else if lbIP != "" {
			asked = append(asked, lbIP)
		}
		req := map[bool]netip.Addr{}
		valid := true
		for _, x := range asked {
			a, err := netip.ParseAddr(x)
			a = a.Unmap()
			fam := corev1.IPv6Protocol
			if a.Is4() {
				fam = corev1.IPv4Protocol
			}
			if err != nil || a.Zone() != "" || !slices.Contains(fams, fam) || req[a.Is4()].IsValid() {
				valid = false
				break
			}
			req[a.Is4()] = a
		}
		if !valid {
			if len(st.IPs) > 0 || st.Reason != LBReasonInvalidRequestedIP {
				t.Fatalf("request %q (loadBalancerIP %q) is invalid, yet the Service got %v (%s: %s)", ann, lbIP, st.IPs, st.Reason, st.Message)
			}
			return
		}
		got := map[bool]netip.Addr{}
		for _, a := range st.IPs {
			if !inPool(a) || got[a.Is4()].IsValid() || !slices.Contains(fams, map[bool]corev1.IPFamily{true: corev1.IPv4Protocol, false: corev1.IPv6Protocol}[a.Is4()]) {
				t.Fatalf("request %q: the Service got %v, not one plain pool address per family of %v", ann, st.IPs, fams)
			}
			got[a.Is4()] = a
		}
		for _, fam := range fams {
			v4 := fam == corev1.IPv4Protocol
			r, asked := req[v4]
			switch {
			case !asked && !got[v4].IsValid():
				t.Fatalf("request %q: no %s address, though none was asked for and the pool has room (%s)", ann, fam, st.Message)
			case asked && inPool(r) && r != netip.MustParseAddr("192.0.2.5") && got[v4] != r:
				t.Fatalf("request %q: asked for %s, got %v (%s)", ann, r, st.IPs, st.Message)
			case asked && (!inPool(r) || r == netip.MustParseAddr("192.0.2.5")) && got[v4].IsValid():
				t.Fatalf("request %q: asked for %s, which it cannot have, and got %v instead", ann, r, st.IPs)
			}
		}
	})
}

// FuzzTrafficDistributionAnnotation: lace-cni.io/traffic-distribution
// has one value, PreferClosest (this node's ready endpoints, else this
// zone's, else all); any other value is ignored: the Service's endpoints
// are what they are without the annotation.
func FuzzTrafficDistributionAnnotation(f *testing.F) {
	for _, v := range []string{"PreferClosest", "preferclosest", " PreferClosest", "PreferClose", "", "PreferSameNode"} {
		f.Add(v, uint16(0x0f0f))
		// Two of four ready endpoints on this node: PreferClosest
		// narrows to them, any other value does not.
		f.Add(v, uint16(0x0f03))
	}
	f.Add("PreferClosest", uint16(0xff00))
	f.Add("PreferClosest", uint16(0x00f3))
	f.Add("PreferClosest", uint16(0x0f01))
	f.Fuzz(func(t *testing.T, value string, layout uint16) {
		// Four endpoints: on n1 (this node) or not, in z1 (this zone) or
		// not, ready or serving-terminating, with or without hints, as
		// the layout's bits say.
		var eps []svcEndpoint
		for i := range 4 {
			bit := func(k int) bool { return layout>>(4*k+i)&1 == 1 }
			e := svcEndpoint{addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), node: "n2", zone: "z2", serving: true}
			if bit(0) {
				e.node = "n1"
			}
			if bit(1) {
				e.zone = "z1"
			}
			e.ready = bit(2)
			e.terminate = !e.ready
			if bit(3) {
				e.forNodes, e.forZones = []string{e.node}, []string{e.zone}
			}
			eps = append(eps, e)
		}
		plain := &corev1.Service{}
		annotated := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{lacev1.AnnotationTrafficDistribution: value}}}
		got := clusterEndpoints(eps, annotated, "n1", "z1")
		if value != TrafficDistributionPreferClosest {
			if want := clusterEndpoints(eps, plain, "n1", "z1"); !slices.EqualFunc(got, want, sameEndpoint) {
				t.Fatalf("annotation %q, which is not PreferClosest, changed the endpoints from %v to %v", value, want, got)
			}
			return
		}
		ready := filterEndpoints(eps, func(e svcEndpoint) bool { return e.ready })
		want := ready
		if len(ready) == 0 {
			want = filterEndpoints(eps, func(e svcEndpoint) bool { return e.terminate })
		} else if local := filterEndpoints(ready, func(e svcEndpoint) bool { return e.node == "n1" }); len(local) > 0 {
			want = local
		} else if zone := filterEndpoints(ready, func(e svcEndpoint) bool { return e.zone == "z1" }); len(zone) > 0 {
			want = zone
		}
		if !slices.EqualFunc(got, want, sameEndpoint) {
			t.Fatalf("PreferClosest gave %v, want %v", got, want)
		}
	})
}

func sameEndpoint(a, b svcEndpoint) bool { return a.addr == b.addr }

// FuzzEndpointAnnotation: lace-cni.io/endpoint on a learned FDBEntry
// names the NetworkEndpoint the MAC is held for. An entry without one, or
// whose MAC is no Ethernet MAC, is not placed; any other value is carried
// as written (the agent matches it against its ports' names, so a value
// naming no port places nothing).
func FuzzEndpointAnnotation(f *testing.F) {
	for _, s := range [][2]string{{"default/a", "52:54:00:00:00:01"}, {"", "52:54:00:00:00:01"}, {"x", "52-54-00-00-00-01"},
		{"default/a", "02:00:5e:10:00:00:00:01"}, {"/", "5254.0000.0001"}, {"a/b/c", "zz"}} {
		f.Add(s[0], s[1])
	}
	learning := l2("vms", nil, "10.50.0.0/24")
	learning.Spec.L2 = &lacev1.L2Options{Learning: true}
	learning.Status.ID = 7
	f.Fuzz(func(t *testing.T, ep, mac string) {
		fe := fdb("vms", mac, "n1")
		fe.Spec.Learned = true
		fe.Annotations = map[string]string{lacev1.AnnotationEndpoint: ep}
		st := ComputeNode(NodeInput{Node: "n1", Networks: []lacev1.Network{learning}, FDBEntries: []lacev1.FDBEntry{fe}})
		m, err := net.ParseMAC(mac)
		placed := ep != "" && err == nil && len(m) == 6
		if len(st.L2Learned) != map[bool]int{true: 1, false: 0}[placed] {
			t.Fatalf("endpoint %q, MAC %q: placed %+v", ep, mac, st.L2Learned)
		}
		if placed && (st.L2Learned[0].Endpoint != ep || st.L2Learned[0].MAC.String() != m.String() || st.L2Learned[0].NetID != 7) {
			t.Fatalf("endpoint %q, MAC %q placed as %+v", ep, mac, st.L2Learned[0])
		}
	})
}
