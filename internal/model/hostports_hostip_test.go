package model

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestHostPortHostIPSpellings: the scheduler's NodePorts filter and the
// kubelet's admission (framework.HostPortInfo) compare hostIP as a
// string, only "" and "0.0.0.0" meaning every address: "::",
// "::ffff:172.30.0.11", "0:0::11"-like spellings and "172.30.0.11" are
// different IPs to them and never conflict. ComputeHostPorts used to read
// "::" as every address of both families and to unmap a v4-mapped hostIP,
// so an older pod of tenant A on such a hostIP took 172.30.0.11:443 from
// tenant V's younger pod there (V's pod replaced: A gets V's clients).
// Now two pods the kubelet lets run side by side never share an address:
// "::" is IPv6 only and yields an address a pod names; a v4-mapped or
// non-canonical hostIP is refused (HostPortHostIP); and a conflict's
// message does not name another namespace's pod.
func TestHostPortHostIPSpellings(t *testing.T) {
	n4, n6 := netip.MustParseAddr("172.30.0.11"), netip.MustParseAddr("fd00:30::11")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(ns, name string, age int, hostIP string, addrs ...string) HostPortPod {
		p := HostPortPod{Namespace: ns, Name: name, UID: types.UID("uid-" + name), NetID: 7,
			Created: metav1.NewTime(t0.Add(time.Duration(age) * time.Second)),
			Ports:   []corev1.ContainerPort{{HostIP: hostIP, HostPort: 443, ContainerPort: 8443, Protocol: corev1.ProtocolTCP}}}
		for _, a := range addrs {
			p.Addrs = append(p.Addrs, netip.MustParseAddr(a))
		}
		return p
	}
	v4, v6 := netip.MustParseAddr("10.0.1.2"), netip.MustParseAddr("fd00::1:2")
	squat6 := netip.MustParseAddr("fd00::1:66")
	for _, tc := range []struct {
		spell string
		// victim's hostIP and addresses
		victimIP string
		victim   []string
		// what each address serves (invalid: nothing)
		want map[netip.Addr]netip.Addr
		// the squatter's refusal reason, if any
		refused string
	}{
		{"::", n4.String(), []string{"10.0.1.2"},
			map[netip.Addr]netip.Addr{n4: v4, n6: squat6, loopback6: squat6, loopback4: {}}, ""},
		// "::" yields the IPv6 address V names, even being older.
		{"::", n6.String(), []string{"10.0.1.2", "fd00::1:2"},
			map[netip.Addr]netip.Addr{n6: v6, loopback6: squat6, n4: {}, loopback4: {}}, HostPortConflict},
		{"::ffff:172.30.0.11", n4.String(), []string{"10.0.1.2"},
			map[netip.Addr]netip.Addr{n4: v4, n6: {}}, HostPortHostIP},
		{"FD00:30::11", n6.String(), []string{"fd00::1:2"},
			map[netip.Addr]netip.Addr{n6: v6, n4: {}}, HostPortHostIP},
		{"fd00:30:0::11", n6.String(), []string{"fd00::1:2"},
			map[netip.Addr]netip.Addr{n6: v6}, HostPortHostIP},
		{"::0", "::", []string{"fd00::1:2"},
			map[netip.Addr]netip.Addr{n6: v6, loopback6: v6}, HostPortHostIP},
	} {
		t.Run(tc.spell+"/"+tc.victimIP, func(t *testing.T) {
			in := HostPortInput{NodeAddrs: []netip.Addr{n4, n6}, Pods: []HostPortPod{
				pod("tenant-a", "squatter", 1, tc.spell, "10.0.1.66", "fd00::1:66"), // older, admitted by the kubelet
				pod("tenant-v", "web-new", 2, tc.victimIP, tc.victim...),            // V's replacement, scheduled beside it
			}}
			got, refused := ComputeHostPorts(in, nil)
			served := map[netip.Addr]netip.Addr{}
			for _, s := range got {
				if s.Port == 443 {
					served[s.VIP] = s.Backends[0].Addr
				}
			}
			for at, want := range tc.want {
				if served[at] != want {
					t.Errorf("hostIP %q beside %q: %s:443 goes to %v, want %v; refusals %+v", tc.spell, tc.victimIP, at, served[at], want, refused)
				}
			}
			var reasons []string
			for _, r := range refused {
				if r.Namespace == "tenant-v" {
					t.Errorf("tenant-v's pod refused (%s: %s): the kubelet lets both run", r.Reason, r.Message)
				}
				if strings.Contains(r.Message, "tenant-v") || strings.Contains(r.Message, "web-new") {
					t.Errorf("tenant-a's refusal names tenant-v's pod: %s", r.Message)
				}
				reasons = append(reasons, r.Reason)
			}
			if tc.refused == "" && len(reasons) > 0 || tc.refused != "" && (len(reasons) != 1 || reasons[0] != tc.refused) {
				t.Errorf("refusals %v, want %q", reasons, tc.refused)
			}
		})
	}
	// A conflict within a namespace names the holder; across namespaces
	// it does not.
	for _, ns := range []string{"tenant-v", "tenant-a"} {
		in := HostPortInput{NodeAddrs: []netip.Addr{n4}, Pods: []HostPortPod{
			pod("tenant-v", "web", 1, n4.String(), "10.0.1.2"), pod(ns, "late", 2, "", "10.0.1.3")}}
		_, refused := ComputeHostPorts(in, nil)
		named := len(refused) > 0 && strings.Contains(refused[0].Message, "tenant-v/web")
		if len(refused) == 0 || refused[0].Reason != HostPortConflict || named != (ns == "tenant-v") {
			t.Errorf("a %s pod beside tenant-v/web: refusals %+v, want HostPortConflict naming the holder only within its namespace", ns, refused)
		}
	}
}
