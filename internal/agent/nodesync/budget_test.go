package nodesync

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// TestServiceBudgetRefusesWhole: a Service over the per-Service budget is
// left out whole (no frontend, no VIP in the views) while every other
// Service is programmed, and when the maps cannot hold all the others the
// newest are refused first, so the older ones keep working.
func TestServiceBudgetRefusesWhole(t *testing.T) {
	nets := []lacev1.Network{{ObjectMeta: metav1.ObjectMeta{Name: "default", ResourceVersion: "1"}, Status: lacev1.NetworkStatus{ID: 1}}}
	nbps := []lacev1.NetworkBindingPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "default", ResourceVersion: "1"},
		Spec: lacev1.NetworkBindingPolicySpec{Network: "default", Priority: model.CatchAllPriority}}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	svc := func(name string, age int, ports, externalIPs int) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1",
			CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Minute))},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP}}
		vip := fmt.Sprintf("10.96.0.%d", 10+age)
		s.Spec.ClusterIP, s.Spec.ClusterIPs = vip, []string{vip}
		for p := range ports {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: fmt.Sprint("p", p), Protocol: corev1.ProtocolTCP, Port: int32(1000 + p)})
		}
		for i := range externalIPs {
			s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, fmt.Sprintf("192.0.2.%d", i+1))
		}
		return s
	}
	in := model.ServiceInput{Node: "n1", Networks: nets, BindingPolicies: nbps,
		AllowedExternalIPs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	// Per Service at most 20 frontends; the maps hold 30.
	c := &serviceCache{budget: model.Budget{ServiceFrontends: 20, TotalFrontends: 30}}
	huge := svc("huge", 0, 10, 4)     // 5 VIPs x 10 ports = 50 frontends
	old := svc("old", 1, 12, 0)       // 12
	middle := svc("middle", 2, 12, 0) // 12: 24 in all
	young := svc("young", 3, 10, 0)   // 10: 34, over the maps
	small := svc("small", 4, 5, 0)    // 5: fits beside old and middle
	st, vips, _ := c.updateLists(in, true, []*corev1.Service{huge, old, middle, young, small}, nil)
	byName := map[string]int{}
	for _, s := range st.Services {
		switch {
		case s.VIP == netip.MustParseAddr(huge.Spec.ClusterIP) || s.VIP.Is4() && s.VIP.As4()[0] == 192:
			byName["huge"]++
		case s.VIP == netip.MustParseAddr(old.Spec.ClusterIP):
			byName["old"]++
		case s.VIP == netip.MustParseAddr(middle.Spec.ClusterIP):
			byName["middle"]++
		case s.VIP == netip.MustParseAddr(young.Spec.ClusterIP):
			byName["young"]++
		case s.VIP == netip.MustParseAddr(small.Spec.ClusterIP):
			byName["small"]++
		}
	}
	want := map[string]int{"old": 12, "middle": 12, "small": 5}
	if fmt.Sprint(byName) != fmt.Sprint(want) {
		t.Errorf("frontends programmed by service %v, want %v", byName, want)
	}
	for _, v := range vips {
		if v.Name == "huge" || v.Name == "young" {
			t.Errorf("refused service %s still has VIPs %v in the views", v.Name, v.VIPs)
		}
	}
	refused := c.refused
	if r := refused[model.ServiceKey{Namespace: "t", Name: "huge"}]; r.Reason != model.ReasonServiceOverBudget {
		t.Errorf("huge: refusal %+v, want %s", r, model.ReasonServiceOverBudget)
	}
	if r := refused[model.ServiceKey{Namespace: "t", Name: "young"}]; r.Reason != model.ReasonMapsFull {
		t.Errorf("young: refusal %+v, want %s", r, model.ReasonMapsFull)
	}
	if len(refused) != 2 {
		t.Errorf("refused %v, want huge and young only", refused)
	}
	// huge goes: old, middle and young (34 frontends) still exceed the
	// maps' 30, so young, the newest, stays refused.
	st, _, _ = c.updateLists(in, false, []*corev1.Service{old, middle, young}, nil)
	if _, ok := c.refused[model.ServiceKey{Namespace: "t", Name: "young"}]; !ok || len(st.Services) != 24 {
		t.Errorf("without huge: refused %v, %d frontends; want young refused, 24", c.refused, len(st.Services))
	}
	// middle goes too: young fits and is programmed.
	st, _, _ = c.updateLists(in, false, []*corev1.Service{old, young}, nil)
	if len(c.refused) != 0 || len(st.Services) != 22 {
		t.Errorf("with middle gone: refused %v, %d frontends; want none refused, 22", c.refused, len(st.Services))
	}
}
