//go:build rev17b

package nodesync

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/lace-cni/lace/internal/model"
)

// A tenant takes another Service's programmed room across a restart:
// while the node's agent is down (a rolling upgrade restarts every agent,
// predictably), tenant a's old Service is deleted and tenant evil creates
// a Service asking for its ClusterIP (spec.clusterIP is the tenant's to
// choose among free addresses) and ports. The restarted agent seeds the
// budget by frontend key (programmedCost), so evil's Service, the newest
// of all, is taken as admitted before the restart and keeps that room
// first; tenant c's Service, created earlier in the same window, is the
// one refused. A running agent refuses evil's (the newest). Open (not
// fixed): the map names frontends, not Services; the data plane holds no
// creation time or UID to tell them apart.
func TestRev17bRestartClusterIPReuseJumpsQueue(t *testing.T) {
	in, svc := budgetFixture()
	budget := model.Budget{ServiceFrontends: 25, TotalFrontends: 30}
	old, web := svc("a", "old", 0, 10, "1"), svc("b", "web", 5, 10, "1")
	before := &serviceCache{budget: budget}
	st, _, _ := before.updateLists(in, true, []*corev1.Service{old, web}, nil)
	if len(before.refused) != 0 {
		t.Fatalf("before: %v", before.refused)
	}
	// While no agent runs: a/old is deleted, c/new (15 ports) created,
	// then evil/x on a/old's ClusterIP and ports.
	cnew := svc("c", "new", 10, 15, "1")
	evil := svc("evil", "x", 20, 10, "1")
	evil.Spec.ClusterIP, evil.Spec.ClusterIPs = old.Spec.ClusterIP, old.Spec.ClusterIPs
	after := &serviceCache{budget: budget, programmed: programmedOf(st.Services)}
	after.updateLists(in, true, []*corev1.Service{web, cnew, evil}, nil)
	if r, ok := after.refused[model.ServiceKey{Namespace: "c", Name: "new"}]; ok {
		t.Errorf("QUEUE JUMP: tenant c's Service refused after the restart (%s), tenant evil's newer one on a deleted Service's ClusterIP admitted", r.Reason)
	}
	if _, ok := after.refused[model.ServiceKey{Namespace: "evil", Name: "x"}]; !ok {
		t.Errorf("the newest Service (evil's) was admitted; a running agent refuses it")
	}
}
