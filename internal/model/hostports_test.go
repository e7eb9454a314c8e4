package model

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lace-cni/lace/internal/tables"
)

func TestComputeHostPorts(t *testing.T) {
	n4, n6 := netip.MustParseAddr("172.30.0.11"), netip.MustParseAddr("fd00:30::11")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(name string, age int, addrs []string, ports ...corev1.ContainerPort) HostPortPod {
		p := HostPortPod{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), NetID: 7,
			Created: metav1.NewTime(t0.Add(time.Duration(age) * time.Second)), Ports: ports}
		for _, a := range addrs {
			p.Addrs = append(p.Addrs, netip.MustParseAddr(a))
		}
		return p
	}
	dual := []string{"10.0.1.2", "fd00::1:2"}
	hp := func(hostIP string, proto corev1.Protocol, port int32) corev1.ContainerPort {
		return corev1.ContainerPort{HostIP: hostIP, Protocol: proto, HostPort: port, ContainerPort: 8080}
	}
	nodePort := tables.Service{VIP: n4, Proto: 6, Port: 30080, NetID: 7, Frontend: tables.FrontendNodePort}
	in := HostPortInput{NodeAddrs: []netip.Addr{n4, n6},
		Reserved: []ReservedPort{{Proto: 6, Port: 10250, What: "kubelet"}, {Proto: 6, Port: 6443, Addr: n4, What: "API server"}},
		Pods: []HostPortPod{
			// The upstream spec's three pods: same port, other hostIP or
			// protocol.
			pod("local", 1, dual, hp("127.0.0.1", "", 54323)),
			pod("tcp", 2, dual, hp(n4.String(), corev1.ProtocolTCP, 54323)),
			pod("udp", 3, dual, hp(n4.String(), corev1.ProtocolUDP, 54323)),
			// Every address, both families.
			pod("any", 4, dual, hp("", corev1.ProtocolTCP, 80)),
			// Younger, same address and port: refused.
			pod("late", 5, []string{"10.0.1.9"}, hp("0.0.0.0", corev1.ProtocolTCP, 80), hp(n6.String(), corev1.ProtocolTCP, 81)),
			pod("bad", 6, dual, hp("192.0.2.1", "", 90), hp("", "", 30080), hp("", "", 10250), hp("", "", 6443),
				hp("", "", 61000), hp("", corev1.ProtocolSCTP, 91)),
		}}
	got, refused := ComputeHostPorts(in, []tables.Service{nodePort})
	type entry struct {
		at       netip.AddrPort
		proto    uint8
		backend  netip.Addr
		frontend tables.Frontend
	}
	var entries []entry
	for _, s := range got {
		var be netip.Addr
		if s.Frontend == tables.FrontendHostPort {
			be = s.Backends[0].Addr
			if len(s.Backends) != 1 || s.ClusterIP != be || s.ClusterPort != 8080 || s.Backends[0].Port != 8080 || s.NetID != 7 {
				t.Errorf("entry %+v: want the pod as its one backend and its ClusterIP", s)
			}
		}
		entries = append(entries, entry{netip.AddrPortFrom(s.VIP, s.Port), s.Proto, be, s.Frontend})
	}
	p4, p6 := netip.MustParseAddr("10.0.1.2"), netip.MustParseAddr("fd00::1:2")
	ap := func(a netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(a, p) }
	want := []entry{
		{ap(netip.MustParseAddr("127.0.0.1"), 80), 6, p4, tables.FrontendHostPort},
		{ap(netip.MustParseAddr("127.0.0.1"), 6443), 6, p4, tables.FrontendHostPort},
		{ap(netip.MustParseAddr("127.0.0.1"), 54323), 6, p4, tables.FrontendHostPort},
		{ap(n4, 80), 6, p4, tables.FrontendHostPort},
		{ap(n4, 30080), 6, netip.Addr{}, tables.FrontendNodePort},
		{ap(n4, 54323), 6, p4, tables.FrontendHostPort},
		{ap(n4, 54323), 17, p4, tables.FrontendHostPort},
		{ap(netip.IPv6Loopback(), 80), 6, p6, tables.FrontendHostPort},
		{ap(netip.IPv6Loopback(), 6443), 6, p6, tables.FrontendHostPort},
		{ap(netip.IPv6Loopback(), 30080), 6, p6, tables.FrontendHostPort},
		{ap(n6, 80), 6, p6, tables.FrontendHostPort},
		{ap(n6, 6443), 6, p6, tables.FrontendHostPort},
		{ap(n6, 30080), 6, p6, tables.FrontendHostPort},
	}
	// 127.0.0.1:30080 is bad's too (the NodePort is on n4 only).
	want = slices.Insert(want, 2, entry{ap(netip.MustParseAddr("127.0.0.1"), 30080), 6, p4, tables.FrontendHostPort})
	if !slices.Equal(entries, want) {
		t.Errorf("entries:\n%v\nwant\n%v", entries, want)
	}
	reasons := map[string][]string{}
	for _, r := range refused {
		reasons[r.Name] = append(reasons[r.Name], r.Reason)
	}
	wantR := map[string][]string{
		// late has no IPv6 address: 81 on n6 is of a family it lacks.
		"late": {HostPortConflict, HostPortConflict, HostPortUnsupported},
		"bad": {HostPortHostIP, HostPortTaken, HostPortReserved, HostPortReserved, HostPortReserved, HostPortReserved, HostPortReserved,
			HostPortReserved, HostPortUnsupported},
	}
	for name, w := range wantR {
		if !slices.Equal(reasons[name], w) {
			t.Errorf("%s refused %v, want %v", name, reasons[name], w)
		}
	}
	if len(reasons) != len(wantR) {
		t.Errorf("refusals %v, want only %v", reasons, wantR)
	}
	// The input order does not matter: the oldest wins.
	slices.Reverse(in.Pods)
	got2, refused2 := ComputeHostPorts(in, []tables.Service{nodePort})
	if !slices.EqualFunc(got, got2, func(a, b tables.Service) bool { return a.VIP == b.VIP && slices.Equal(a.Backends, b.Backends) }) ||
		len(refused2) != len(refused) {
		t.Errorf("another input order changed the result")
	}

	// Bounds: one pod's 64 entries, the node's limit across pods (the
	// oldest first).
	var many []corev1.ContainerPort
	for port := int32(1000); port < 1100; port++ {
		many = append(many, hp(n4.String(), corev1.ProtocolTCP, port))
	}
	big := pod("big", 1, dual, many...)
	got, refused = ComputeHostPorts(HostPortInput{NodeAddrs: in.NodeAddrs, Pods: []HostPortPod{big}}, nil)
	if len(got) != MaxHostPortEntriesPerPod || len(refused) != 100-MaxHostPortEntriesPerPod || refused[0].Reason != HostPortLimit {
		t.Errorf("a pod with 100 hostPorts got %d entries and %d refusals, want %d and the rest HostPortLimit", len(got), len(refused), MaxHostPortEntriesPerPod)
	}
	// Node limit 64: a namespace holds at most 16 of them, so four
	// namespaces' big pods take it all and a fifth's younger pod is
	// refused; a second pod of a full namespace is refused too.
	var pods []HostPortPod
	for i, ns := range []string{"a", "b", "c", "d"} {
		b := pod("big-"+ns, 1+i, dual, many...)
		b.Namespace = ns
		pods = append(pods, b)
	}
	younger := pod("younger", 9, dual, hp(n4.String(), corev1.ProtocolTCP, 2000))
	younger.Namespace = "e"
	sibling := pod("sibling", 8, dual, hp(n4.String(), corev1.ProtocolTCP, 2001))
	sibling.Namespace = "a"
	got, refused = ComputeHostPorts(HostPortInput{NodeAddrs: in.NodeAddrs, Pods: append(pods, younger, sibling), MaxEntries: 64}, nil)
	refusedOf := map[string]int{}
	for _, r := range refused {
		refusedOf[r.Name]++
	}
	if len(got) != 64 || refusedOf["big-a"] != 100-16 || refusedOf["younger"] != 1 || refusedOf["sibling"] != 1 {
		t.Errorf("node limit 64: %d entries, refusals %v; want 16 of each namespace's big pod, younger and sibling refused", len(got), refusedOf)
	}
}

// TestHostPortBudgetPerTenant: one tenant pins 16 pods of 64 entries
// each (16 hostPorts on an empty hostIP: two node addresses and two
// loopbacks) to a node, as many as the node's whole share; another
// namespace's one hostPort there is still served, and the tenant keeps
// its namespace's quarter.
func TestHostPortBudgetPerTenant(t *testing.T) {
	n4, n6 := netip.MustParseAddr("172.30.0.11"), netip.MustParseAddr("fd00:30::11")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	in := HostPortInput{NodeAddrs: []netip.Addr{n4, n6}}
	for i := range 16 {
		p := HostPortPod{Namespace: "hog", Name: fmt.Sprintf("hog-%d", i), UID: types.UID(fmt.Sprintf("hog-%d", i)), NetID: 7,
			Created: metav1.NewTime(t0.Add(time.Duration(i) * time.Second)),
			Addrs:   []netip.Addr{netip.AddrFrom4([4]byte{10, 0, 1, byte(10 + i)}), netip.MustParseAddr(fmt.Sprintf("fd00::1:%x", 10+i))}}
		for j := range 16 {
			p.Ports = append(p.Ports, corev1.ContainerPort{HostPort: int32(20000 + 16*i + j), ContainerPort: 80})
		}
		in.Pods = append(in.Pods, p)
	}
	victim := HostPortPod{Namespace: "victim", Name: "web", UID: "victim", NetID: 7, Created: metav1.NewTime(t0.Add(time.Hour)),
		Addrs: []netip.Addr{netip.MustParseAddr("10.0.2.2")},
		Ports: []corev1.ContainerPort{{HostPort: 8080, ContainerPort: 80, HostIP: n4.String()}}}
	in.Pods = append(in.Pods, victim)
	got, refused := ComputeHostPorts(in, nil)
	for _, r := range refused {
		if r.Namespace == "victim" {
			t.Errorf("another namespace's one hostPort refused (%s: %s): one tenant took the node's whole share", r.Reason, r.Message)
		}
	}
	hog := 0
	for _, s := range got {
		if s.VIP != n4 || s.Port != 8080 {
			hog++
		}
	}
	if hog != MaxHostPortEntries/4 {
		t.Errorf("the tenant holds %d entries, want its namespace's share %d", hog, MaxHostPortEntries/4)
	}
}

// TestAddHostPortsIsTheSortedUnion: the hostPorts join the services'
// list at their keys' places (a merge, not a sort of the whole list), and
// none of the services' entries moves or is lost.
func TestAddHostPortsIsTheSortedUnion(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for range 200 {
		at := map[tables.FrontendKey]bool{}
		var svcs, entries []tables.Service
		for range rng.IntN(40) {
			s := tables.Service{VIP: netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.IntN(8))}), Proto: 6, Port: uint16(rng.IntN(16))}
			if at[s.Key()] {
				continue
			}
			at[s.Key()] = true
			if rng.IntN(4) == 0 {
				s.Frontend = tables.FrontendHostPort
				entries = append(entries, s)
			} else {
				svcs = append(svcs, s)
			}
		}
		byKey := func(a, b tables.Service) int { return a.Key().Compare(b.Key()) }
		slices.SortFunc(svcs, byKey)
		slices.SortFunc(entries, byKey)
		want := slices.SortedFunc(slices.Values(append(slices.Clone(svcs), entries...)), byKey)
		if got := AddHostPorts(svcs, entries); !reflect.DeepEqual(got, want) && len(got)+len(want) > 0 {
			t.Fatalf("AddHostPorts(%v, %v) = %v, want %v", svcs, entries, got, want)
		}
	}
}
