package nodesync

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// TestCacheTrimKeepsWhatTheAgentReads: the trimmed Service and
// EndpointSlice give the same services as the whole objects, keep what the
// watches' predicates and the programming latency read, and lose the rest.
func TestCacheTrimKeepsWhatTheAgentReads(t *testing.T) {
	meta := metav1.ObjectMeta{Namespace: "a", Name: "web", UID: "u", ResourceVersion: "7", Generation: 3,
		Labels: map[string]string{"net": "red", discoveryv1.LabelServiceName: "web"},
		Annotations: map[string]string{lacev1.AnnotationTrafficDistribution: model.TrafficDistributionPreferClosest,
			corev1.EndpointsLastChangeTriggerTime: "2026-11-21T10:00:00Z", "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
		ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		OwnerReferences: []metav1.OwnerReference{{Name: "web"}}}
	svc := &corev1.Service{ObjectMeta: meta, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10",
		ClusterIPs: []string{"10.96.0.10"}, Selector: map[string]string{"app": "web"}, SessionAffinity: corev1.ServiceAffinityClientIP,
		SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}},
		InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyCluster), IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
		Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}}}}
	sl := &discoveryv1.EndpointSlice{ObjectMeta: meta, AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}}}
	for i, a := range []string{"10.1.0.5", "10.1.0.6", "10.1.0.7"} {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Hostname: ptr.To("h"),
			NodeName: ptr.To("n1"), Zone: ptr.To("z1"), Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(i > 0), Serving: ptr.To(true), Terminating: ptr.To(i == 0)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "a", Name: "p", UID: "pu", ResourceVersion: "9"}})
	}
	in := model.ServiceInput{Node: "n1", Zone: "z1",
		Networks:        []lacev1.Network{{ObjectMeta: metav1.ObjectMeta{Name: "red"}, Status: lacev1.NetworkStatus{ID: 2}}},
		BindingPolicies: []lacev1.NetworkBindingPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "red"}, Spec: lacev1.NetworkBindingPolicySpec{Network: "red"}}},
		NetworkEndpoints: []lacev1.NetworkEndpoint{{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p",
			Labels: map[string]string{"lace-cni.io/pod-uid": "pu"}}, Spec: lacev1.NetworkEndpointSpec{Network: "red", Addresses: []lacev1.IPAddress{"10.1.0.5"}}}}}
	whole := in
	whole.Services, whole.EndpointSlices = []corev1.Service{*svc.DeepCopy()}, []discoveryv1.EndpointSlice{*sl.DeepCopy()}
	want := model.ComputeServices(whole)

	ts, _ := trimService(svc.DeepCopy())
	tsl, _ := trimEndpointSlice(sl.DeepCopy())
	trimmed := in
	trimmed.Services = []corev1.Service{*ts.(*corev1.Service)}
	trimmed.EndpointSlices = []discoveryv1.EndpointSlice{*tsl.(*discoveryv1.EndpointSlice)}
	if got := model.ComputeServices(trimmed); !reflect.DeepEqual(got, want) || len(got.Services) != 1 || len(got.Services[0].Backends) != 2 {
		t.Errorf("trimmed objects give\n%+v\nwant\n%+v", got, want)
	}
	s, e := trimmed.Services[0], trimmed.EndpointSlices[0]
	for _, m := range []metav1.ObjectMeta{s.ObjectMeta, e.ObjectMeta} {
		if m.Generation != 3 || m.ResourceVersion != "7" || m.UID != "u" || len(m.Labels) != 2 || m.ManagedFields != nil ||
			m.OwnerReferences != nil || m.Annotations["kubectl.kubernetes.io/last-applied-configuration"] != "" {
			t.Errorf("metadata %+v", m)
		}
	}
	if s.Annotations[lacev1.AnnotationTrafficDistribution] == "" || e.Annotations[corev1.EndpointsLastChangeTriggerTime] == "" ||
		s.Spec.Selector != nil || e.Endpoints[0].Hostname != nil {
		t.Errorf("trimmed Service %+v, EndpointSlice %+v", s, e)
	}
	// Other kinds pass through.
	if o, err := trimService(sl); o != any(sl) || err != nil {
		t.Errorf("trimService of an EndpointSlice: %v %v", o, err)
	}
}
