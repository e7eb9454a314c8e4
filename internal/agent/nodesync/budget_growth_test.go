package nodesync

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// TestServiceBudgetGrowthIsNew: an old Service that grows (ports added
// later) is judged by its growth, as the newest demand: the newer Service
// of another namespace that was working keeps working, the grown one is
// refused. Before, creation time alone decided and the working Service
// was pushed out.
func TestServiceBudgetGrowthIsNew(t *testing.T) {
	in, svc := budgetFixture()
	c := &serviceCache{budget: model.Budget{ServiceFrontends: 25, TotalFrontends: 30}}
	old := svc("a", "old", 0, 1, "1")
	victim := svc("b", "web", 5, 10, "1")
	if c.updateLists(in, true, []*corev1.Service{old, victim}, nil); len(c.refused) != 0 {
		t.Fatalf("before: %v", c.refused)
	}
	// Tenant a's old Service grows to 21 ports: 31 frontends in all, 1
	// over the maps.
	grown := svc("a", "old", 0, 21, "2")
	st, _, _ := c.updateLists(in, false, []*corev1.Service{grown, victim}, nil)
	if r, ok := c.refused[model.ServiceKey{Namespace: "b", Name: "web"}]; ok {
		t.Errorf("working Service evicted by an old one's growth: %+v", r)
	}
	if r := c.refused[model.ServiceKey{Namespace: "a", Name: "old"}]; r.Reason != model.ReasonMapsFull {
		t.Errorf("grown Service: %+v, want %s", r, model.ReasonMapsFull)
	}
	if len(st.Services) != 10 {
		t.Errorf("%d frontends programmed, want victim's 10", len(st.Services))
	}
	// It shrinks back: admitted again.
	if c.updateLists(in, false, []*corev1.Service{svc("a", "old", 0, 1, "3"), victim}, nil); len(c.refused) != 0 {
		t.Errorf("after shrinking: %v", c.refused)
	}
}

// budgetFixture is the default network and a Service maker the budget
// tests share: svc(ns, name, age, ports, rv) is a ClusterIP Service
// created age minutes after t0 with ports TCP ports from 1000.
func budgetFixture() (model.ServiceInput, func(ns, name string, age, ports int, rv string) *corev1.Service) {
	nets := []lacev1.Network{{ObjectMeta: metav1.ObjectMeta{Name: "default", ResourceVersion: "1"}, Status: lacev1.NetworkStatus{ID: 1}}}
	nbps := []lacev1.NetworkBindingPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "default", ResourceVersion: "1"},
		Spec: lacev1.NetworkBindingPolicySpec{Network: "default", Priority: model.CatchAllPriority}}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	svc := func(ns, name string, age, ports int, rv string) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), ResourceVersion: rv,
			CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Minute))},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP}}
		vip := fmt.Sprintf("10.96.0.%d", 10+age)
		s.Spec.ClusterIP, s.Spec.ClusterIPs = vip, []string{vip}
		for p := range ports {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: fmt.Sprint("p", p), Protocol: corev1.ProtocolTCP, Port: int32(1000 + p)})
		}
		return s
	}
	return model.ServiceInput{Node: "n1", Networks: nets, BindingPolicies: nbps}, svc
}

// TestServiceBudgetVerdictSettles: a verdict that refuses a Service only
// because a bigger one was still counted, and then refuses the bigger one
// too, is judged again at once: the small one fits and is admitted, and
// the verdict kept is one that judging again leaves as it is (a verdict
// stands while costs do).
func TestServiceBudgetVerdictSettles(t *testing.T) {
	in, svc := budgetFixture()
	c := &serviceCache{budget: model.Budget{TotalFrontends: 10}}
	big := svc("b", "big", 5, 8, "1")
	if c.updateLists(in, true, []*corev1.Service{big}, nil); len(c.refused) != 0 {
		t.Fatalf("before: %v", c.refused)
	}
	// An older Service new to the node, while the younger one grows past
	// the maps: the first round refuses both (the grown one's 8 still
	// counted when the small one was judged).
	small := svc("a", "small", 0, 3, "1")
	c.updateLists(in, false, []*corev1.Service{small, svc("b", "big", 5, 20, "2")}, nil)
	if r, ok := c.refused[model.ServiceKey{Namespace: "a", Name: "small"}]; ok {
		t.Errorf("the small Service is refused though it fits once the grown one is: %+v", r)
	}
	if _, ok := c.refused[model.ServiceKey{Namespace: "b", Name: "big"}]; !ok {
		t.Errorf("the grown Service is admitted past the maps: refused %v", c.refused)
	}
}
