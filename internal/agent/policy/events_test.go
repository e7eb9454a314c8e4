package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netpolapi"
)

// TestChangedPassesWhatACompileReads: status churn of pods, nodes and
// NetworkEndpoints compiles nothing; every field the compile reads does.
func TestChangedPassesWhatACompileReads(t *testing.T) {
	trim := func(p *corev1.Pod) *netpolapi.PeerPod {
		out, _ := netpolapi.TrimPod(p)
		return out.(*netpolapi.PeerPod)
	}
	pod := func(mut func(*corev1.Pod)) *netpolapi.PeerPod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "u1", ResourceVersion: "1",
			Labels: map[string]string{"app": "a"}},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}}}}}
		if mut != nil {
			mut(p)
		}
		return trim(p)
	}
	node := func(mut func(*corev1.Node)) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "1", Labels: map[string]string{"zone": "a"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}}}
		if mut != nil {
			mut(n)
		}
		return n
	}
	ne := func(mut func(*lacev1.NetworkEndpoint)) *lacev1.NetworkEndpoint {
		e := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "1",
			Labels: map[string]string{lacev1.LabelPodUID: "u1"}},
			Spec: lacev1.NetworkEndpointSpec{Network: "blue", Addresses: []lacev1.IPAddress{"10.1.0.5"}}}
		if mut != nil {
			mut(e)
		}
		return e
	}
	for _, c := range []struct {
		name     string
		old, new any
		want     bool
	}{
		{"pod status", pod(nil), pod(func(p *corev1.Pod) {
			p.ResourceVersion = "2"
			p.Status.Phase = corev1.PodFailed
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady}}
		}), false},
		{"pod labels", pod(nil), pod(func(p *corev1.Pod) { p.Labels = map[string]string{"app": "b"} }), true},
		{"pod named port", pod(nil), pod(func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 81 }), true},
		{"pod replaced", pod(nil), pod(func(p *corev1.Pod) { p.UID = "u2" }), true},
		{"node conditions", node(nil), node(func(n *corev1.Node) {
			n.ResourceVersion = "2"
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}}
			n.Spec.Taints = []corev1.Taint{{Key: "node.kubernetes.io/unreachable", Effect: corev1.TaintEffectNoSchedule}}
		}), false},
		{"node labels", node(nil), node(func(n *corev1.Node) { n.Labels = nil }), true},
		{"node addresses", node(nil), node(func(n *corev1.Node) { n.Status.Addresses[0].Address = "10.0.0.2" }), true},
		{"endpoint conditions", ne(nil), ne(func(e *lacev1.NetworkEndpoint) {
			e.ResourceVersion = "2"
			e.Status.Conditions = []metav1.Condition{{Type: "AddressesAllocated", Status: metav1.ConditionTrue}}
		}), false},
		{"endpoint addresses", ne(nil), ne(func(e *lacev1.NetworkEndpoint) { e.Spec.Addresses = []lacev1.IPAddress{"10.1.0.6"} }), true},
		{"endpoint l2 addresses", ne(nil), ne(func(e *lacev1.NetworkEndpoint) { e.Status.Addresses = []lacev1.IPAddress{"10.2.0.6"} }), true},
		{"endpoint network", ne(nil), ne(func(e *lacev1.NetworkEndpoint) { e.Spec.Network = "red" }), true},
		{"endpoint pod", ne(nil), ne(func(e *lacev1.NetworkEndpoint) { e.Labels[lacev1.LabelPodUID] = "u2" }), true},
		{"policy written", &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1"}},
			&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "2"}}, true},
		{"policy resync", &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1"}},
			&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1"}}, false},
	} {
		if got := changed(c.old, c.new); got != c.want {
			t.Errorf("%s: changed = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestPeerPodsFailClosed: the compile reads the every-pod informer's
// PeerPods, and fails on anything else there rather than compile without
// those pods as peers.
func TestPeerPodsFailClosed(t *testing.T) {
	store := toolscache.NewStore(toolscache.MetaNamespaceKeyFunc)
	peer, _ := netpolapi.TrimPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "u1"}})
	if err := store.Add(peer); err != nil {
		t.Fatal(err)
	}
	if pods, err := peerPods(store); err != nil || len(pods) != 1 || pods[0].Name != "a" {
		t.Fatalf("peerPods = %v, %v; want the one PeerPod", pods, err)
	}
	if err := store.Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"}}); err != nil {
		t.Fatal(err)
	}
	if pods, err := peerPods(store); err == nil {
		t.Fatalf("an untrimmed pod in the store compiled with peers %v", pods)
	}
}
