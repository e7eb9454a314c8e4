//go:build revhost

package model

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestHostPortBudgetPerTenant: the node's 1024 hostPort entries go to the
// oldest pods, whoever owns them. A tenant may pin pods to a node
// (spec.nodeName skips the scheduler; the kubelet checks only conflicts),
// so 16 pods of 64 entries each (16 hostPorts on an empty hostIP: two
// node addresses and two loopbacks) take the node's whole share, and
// every other namespace's hostPort there is refused (HostPortLimit) for
// as long as they live. Nothing in Kubernetes bounds hostPorts per
// namespace (ResourceQuota counts no ports), so the share must be split
// by namespace for one tenant not to starve the others.
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
	_, refused := ComputeHostPorts(in, nil)
	for _, r := range refused {
		if r.Namespace == "victim" {
			t.Errorf("another namespace's one hostPort refused (%s: %s): one tenant took the node's whole share", r.Reason, r.Message)
		}
	}
}
