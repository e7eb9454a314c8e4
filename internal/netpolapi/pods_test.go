package netpolapi

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netpol"
)

// TestPeerPodKeepsWhatPoliciesRead: the informer's transform keeps a pod's
// name, namespace, UID, labels and named ports (no unnamed one, no other
// field), the informer's store can key it, a tombstone passes as it is,
// and PodsOf gives the same peers from it as a compile read before.
func TestPeerPodKeepsWhatPoliciesRead(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "u1", ResourceVersion: "7",
		Labels: map[string]string{"app": "a"}, Annotations: map[string]string{"big": "x"}, OwnerReferences: []metav1.OwnerReference{{Name: "rs"}}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{
			{Name: "c1", Image: "img", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP},
				{ContainerPort: 9000, Protocol: corev1.ProtocolTCP}}},
			{Name: "c2", Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}}}}},
		Status: corev1.PodStatus{PodIP: "10.1.0.5", Phase: corev1.PodRunning}}
	out, err := TrimPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := out.(*PeerPod)
	if !ok {
		t.Fatalf("TrimPod gave %T", out)
	}
	want := &PeerPod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "u1", ResourceVersion: "7",
		Labels: map[string]string{"app": "a"}},
		Ports: []netpol.Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}, {Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}}}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("PeerPod %+v, want %+v", p, want)
	}
	if k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(p); err != nil || k != "ns/a" {
		t.Fatalf("store key %q, %v", k, err)
	}
	cp := p.DeepCopyObject().(*PeerPod)
	cp.Labels["app"], cp.Ports[0].Port = "b", 81
	if p.Labels["app"] != "a" || p.Ports[0].Port != 80 {
		t.Fatal("DeepCopyObject shares the labels or the ports")
	}
	tomb := toolscache.DeletedFinalStateUnknown{Key: "ns/a", Obj: p}
	if got, _ := TrimPod(tomb); got != tomb {
		t.Fatalf("a tombstone became %v", got)
	}

	ne := lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", Labels: map[string]string{lacev1.LabelPodUID: "u1"}},
		Spec: lacev1.NetworkEndpointSpec{Network: "blue", Addresses: []lacev1.IPAddress{"10.1.0.5"}}}
	nets := []lacev1.Network{{ObjectMeta: metav1.ObjectMeta{Name: "blue"}, Status: lacev1.NetworkStatus{ID: 3}}}
	peers := PodsOf([]*PeerPod{p}, []lacev1.NetworkEndpoint{ne}, nets)
	if len(peers) != 1 || peers[0].NetID != 3 || len(peers[0].Addrs) != 1 || !reflect.DeepEqual(peers[0].Ports, want.Ports) ||
		peers[0].Labels["app"] != "a" {
		t.Fatalf("PodsOf gave %+v", peers)
	}
	// A record of another pod of that name is no peer.
	ne.Labels[lacev1.LabelPodUID] = "u2"
	if peers := PodsOf([]*PeerPod{p}, []lacev1.NetworkEndpoint{ne}, nets); len(peers) != 0 {
		t.Fatalf("a NetworkEndpoint of another pod (UID) made a peer: %+v", peers)
	}
}
