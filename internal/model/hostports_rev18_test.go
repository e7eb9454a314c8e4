package model

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Hostile review rev18 (PoC, failing on purpose).
//
// TestRev18HostIPSpellingsStealPort: the scheduler's NodePorts filter and
// the kubelet's admission (framework.HostPortInfo) compare hostIP as a
// string, with only "" and "0.0.0.0" meaning every address: "::",
// "::ffff:172.30.0.11" and "172.30.0.11" are three different IPs to them
// and never conflict. ComputeHostPorts reads "::" as every address of
// both families (and both loopbacks) and unmaps a v4-mapped hostIP, so
// those pods collide on 172.30.0.11 and the oldest takes it. Attack:
// tenant A keeps a pod pinned to the node (spec.nodeName) with hostPort
// 443 and hostIP "::" (or "::ffff:<node>"); the kubelet admits it beside
// tenant V's pod on hostIP 172.30.0.11:443 (Lace refuses A while V is
// older). The next time V's pod is replaced (rollout, eviction, drain),
// the new pod is scheduled there (no conflict to the scheduler) and is
// younger: A's pod now receives V's clients on 172.30.0.11:443.
func TestRev18HostIPSpellingsStealPort(t *testing.T) {
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
	for _, spell := range []string{"::", "::ffff:172.30.0.11"} {
		t.Run(spell, func(t *testing.T) {
			in := HostPortInput{NodeAddrs: []netip.Addr{n4, n6}, Pods: []HostPortPod{
				pod("tenant-a", "squatter", 1, spell, "10.0.1.66", "fd00::1:66"), // older, admitted by the kubelet
				pod("tenant-v", "web-new", 2, n4.String(), "10.0.1.2"),           // V's replacement, scheduled beside it
			}}
			got, refused := ComputeHostPorts(in, nil)
			for _, s := range got {
				if s.VIP == n4 && s.Port == 443 && s.Backends[0].Addr != netip.MustParseAddr("10.0.1.2") {
					t.Errorf("hostIP %q: %s:443 goes to %s (tenant-a's pod), not tenant-v's pod the kubelet admitted on that hostIP; refusals %+v",
						spell, n4, s.Backends[0].Addr, refused)
				}
			}
		})
	}
}
