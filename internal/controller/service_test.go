package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/controller"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/lab/controlplane/cptest"
)

// TestRefusedEndpointsReportIsBounded: a tenant's EndpointSlices may list
// any number of addresses no agent serves (multicast: 224/4 is 268M of
// them; the API server refuses loopback and link-local ones in slices).
// The controller reports them on the Service, but writes at most a
// screenful: the annotation and the EndpointRefused Event name the first
// twenty and count the rest, so the tenant's slices are not amplified into
// megabytes of annotations and Events in etcd.
func TestRefusedEndpointsReportIsBounded(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, nil)
	c := env.Client
	ctx := context.Background()
	create(t, c, l3Network("default", "10.7.0.0/16", "", 24, 0))
	create(t, c, &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: lacev1.NetworkBindingPolicySpec{Network: "default", Priority: model.CatchAllPriority}})
	create(t, c, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "flood"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}})
	const n = 300
	eps := make([]discoveryv1.Endpoint, n)
	for i := range eps {
		eps[i] = discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("239.1.%d.%d", i/250, i%250+1)}}
	}
	create(t, c, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "flood-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "flood"}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
		Ports: []discoveryv1.EndpointPort{{Port: ptr.To[int32](80), Protocol: ptr.To(corev1.ProtocolTCP)}}})
	more := fmt.Sprintf("and %d more", n-20)
	eventually(t, 30*time.Second, "refused endpoints reported, bounded", func() error {
		var s corev1.Service
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "flood"}, &s); err != nil {
			return err
		}
		a := s.Annotations[lacev1.AnnotationRefusedEndpoints]
		if !strings.HasSuffix(a, more) || strings.Count(a, ",") != 20 || len(a) > 512 {
			return fmt.Errorf("annotation %q (%d bytes), want 20 addresses and %q", a, len(a), more)
		}
		var evs corev1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("default")); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "flood" && e.Reason == controller.ReasonEndpointRefused {
				if !strings.HasSuffix(e.Message, more) || len(e.Message) > 4096 {
					return fmt.Errorf("event message %d bytes: %.200q", len(e.Message), e.Message)
				}
				return nil
			}
		}
		return fmt.Errorf("no %s event", controller.ReasonEndpointRefused)
	})
}

// TestServiceExcludesEndpointsOfOtherNetworks: the controller reads a
// Service's endpoints' NetworkEndpoints by address and by target pod (an
// index, not a list of every pod's in the cluster), and names on the
// Service the endpoints whose pod is in another network, leaving those
// whose pod is in the Service's network served.
func TestServiceExcludesEndpointsOfOtherNetworks(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, nil)
	c := env.Client
	ctx := context.Background()
	create(t, c, l3Network("default", "10.7.0.0/16", "", 24, 0))
	create(t, c, l3Network("other", "10.8.0.0/16", "", 24, 0))
	create(t, c, &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: lacev1.NetworkBindingPolicySpec{Network: "default", Priority: model.CatchAllPriority}})
	// Each NetworkEndpoint has its pod on its node (the controller
	// deletes one that has none).
	create(t, c, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "default"}})
	ne := func(name, network, addr string) *lacev1.NetworkEndpoint {
		create(t, c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "pause"}}}})
		return &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: lacev1.NetworkEndpointSpec{Network: network, Node: "n1", Addresses: []lacev1.IPAddress{lacev1.IPAddress(addr)}}}
	}
	// Found by address: the endpoint names no pod.
	create(t, c, ne("by-addr", "other", "10.7.1.5"))
	// Found by the pod the endpoint names.
	create(t, c, ne("by-pod", "other", "10.7.1.6"))
	create(t, c, ne("mine", "default", "10.7.1.7"))
	// Another network's pod elsewhere in the cluster: not an endpoint.
	create(t, c, ne("unrelated", "other", "10.7.1.9"))
	create(t, c, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}})
	ep := func(addr, pod string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: ptr.To("n1")}
		if pod != "" {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod}
		}
		return e
	}
	create(t, c, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{ep("10.7.1.5", ""), ep("10.7.1.6", "by-pod"), ep("10.7.1.7", "mine")},
		Ports:       []discoveryv1.EndpointPort{{Port: ptr.To[int32](80), Protocol: ptr.To(corev1.ProtocolTCP)}}})
	eventually(t, 30*time.Second, "endpoints of another network named", func() error {
		var s corev1.Service
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "web"}, &s); err != nil {
			return err
		}
		if got, want := s.Annotations[lacev1.AnnotationExcludedEndpoints], "10.7.1.5,10.7.1.6"; got != want {
			return fmt.Errorf("excluded endpoints %q, want %q (annotations %v)", got, want, s.Annotations)
		}
		if got := s.Annotations[lacev1.AnnotationServiceNetwork]; got != "default" {
			return fmt.Errorf("network %q, want default", got)
		}
		return nil
	})
}
