package model

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

func policy(name, network string, prio int32, kind lacev1.MatchKind, sel, nsSel map[string]string) lacev1.NetworkBindingPolicy {
	p := lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: lacev1.NetworkBindingPolicySpec{Network: network, Priority: prio, MatchKind: kind}}
	if sel != nil {
		p.Spec.Selector = &metav1.LabelSelector{MatchLabels: sel}
	}
	if nsSel != nil {
		p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: nsSel}
	}
	return p
}

func TestBind(t *testing.T) {
	policies := []lacev1.NetworkBindingPolicy{
		policy("default", "default", CatchAllPriority, "", nil, nil),
		policy("z-frontend", "front", 10, lacev1.MatchKindPod, map[string]string{"tier": "frontend"}, nil),
		policy("a-frontend", "front2", 10, lacev1.MatchKindPod, map[string]string{"tier": "frontend"}, nil),
		policy("svc-only", "svcnet", 5, lacev1.MatchKindService, map[string]string{"tier": "frontend"}, nil),
		policy("team-ns", "team", 20, "", nil, map[string]string{"team": "a"}),
	}
	for _, tc := range []struct {
		kind       lacev1.MatchKind
		lbl, nsLbl map[string]string
		want       string
	}{
		{lacev1.MatchKindPod, map[string]string{"tier": "frontend"}, nil, "front2"},     // tie broken by name
		{lacev1.MatchKindService, map[string]string{"tier": "frontend"}, nil, "svcnet"}, // matchKind
		{lacev1.MatchKindPod, nil, map[string]string{"team": "a"}, "team"},              // namespaceSelector
		{lacev1.MatchKindPod, map[string]string{"x": "y"}, nil, "default"},              // catch-all
	} {
		got, err := Bind(policies, tc.kind, "ns", "obj", tc.lbl, tc.nsLbl)
		if err != nil || got.Network != tc.want {
			t.Errorf("%s %v ns %v: got %+v %v, want %s", tc.kind, tc.lbl, tc.nsLbl, got, err, tc.want)
		}
	}
	_, err := Bind(policies[1:2], lacev1.MatchKindPod, "default", "web-1", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "no NetworkBindingPolicy matches pod default/web-1") {
		t.Errorf("unmatched pod: %v", err)
	}
}
