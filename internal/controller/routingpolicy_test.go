package controller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/controller"
	"github.com/lace-cni/lace/lab/controlplane/cptest"
)

func labelled(nw *lacev1.Network, kv ...string) *lacev1.Network {
	nw.Labels = map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		nw.Labels[kv[i]] = kv[i+1]
	}
	return nw
}

func routingPolicy(name string, src, dst map[string]string) *lacev1.NetworkRoutingPolicy {
	return &lacev1.NetworkRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lacev1.NetworkRoutingPolicySpec{
		SrcSelector: &metav1.LabelSelector{MatchLabels: src}, DestSelector: &metav1.LabelSelector{MatchLabels: dst}}}
}

// waitNetworkIDs waits until the networks have an ID: only then are they in
// the data plane, and matched by routing policies.
func waitNetworkIDs(t *testing.T, c client.Client, names ...string) {
	t.Helper()
	for _, name := range names {
		eventually(t, 30*time.Second, "network "+name+" has an ID", func() error {
			var nw lacev1.Network
			if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &nw); err != nil {
				return err
			}
			if nw.Status.ID == 0 {
				return fmt.Errorf("no ID yet")
			}
			return nil
		})
	}
}

// waitRoutingPolicy waits until the policy's status describes its current
// generation with the given matches and Ready condition, and returns it.
func waitRoutingPolicy(t *testing.T, c client.Client, name string, src, dst []string, ready metav1.ConditionStatus, reason string) lacev1.NetworkRoutingPolicy {
	t.Helper()
	var p lacev1.NetworkRoutingPolicy
	eventually(t, 30*time.Second, fmt.Sprintf("routing policy %s %s/%s src=%v dst=%v", name, ready, reason, src, dst), func() error {
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &p); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(p.Status.Conditions, lacev1.ConditionReady)
		switch {
		case p.Status.ObservedGeneration != p.Generation:
			return fmt.Errorf("observed generation %d of %d", p.Status.ObservedGeneration, p.Generation)
		case !slices.Equal(p.Status.MatchedSources, src) || !slices.Equal(p.Status.MatchedDestinations, dst):
			return fmt.Errorf("matched %v -> %v", p.Status.MatchedSources, p.Status.MatchedDestinations)
		case cond == nil || cond.Status != ready || cond.Reason != reason || cond.ObservedGeneration != p.Generation:
			return fmt.Errorf("condition %+v", cond)
		}
		return nil
	})
	return p
}

// policyEvents lists the Events on the routing policy with reason.
func policyEvents(t *testing.T, c client.Client, policy, reason string) []corev1.Event {
	t.Helper()
	var evs corev1.EventList
	if err := c.List(context.Background(), &evs); err != nil {
		t.Fatalf("list events: %v", err)
	}
	var out []corev1.Event
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind == "NetworkRoutingPolicy" && e.InvolvedObject.Name == policy && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

func waitPolicyEvent(t *testing.T, c client.Client, policy, reason string, contains ...string) corev1.Event {
	t.Helper()
	var got corev1.Event
	eventually(t, 30*time.Second, fmt.Sprintf("%s event on routing policy %s", reason, policy), func() error {
		for _, e := range policyEvents(t, c, policy, reason) {
			ok := e.Type == corev1.EventTypeWarning
			for _, s := range contains {
				ok = ok && strings.Contains(e.Message, s)
			}
			if ok {
				got = e
				return nil
			}
		}
		return fmt.Errorf("none yet")
	})
	return got
}

func TestRoutingPolicyReportsMatchedNetworks(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, nil)
	c := env.Client
	ctx := context.Background()
	create(t, c, labelled(l3Network("front", "10.50.0.0/16", "", 24, 0), "tier", "frontend"))
	create(t, c, labelled(l3Network("back-b", "10.51.0.0/16", "", 24, 0), "tier", "backend"))
	create(t, c, labelled(l3Network("back-a", "10.52.0.0/16", "", 24, 0), "tier", "backend"))
	waitNetworkIDs(t, c, "front", "back-a", "back-b")
	create(t, c, routingPolicy("front-to-back", map[string]string{"tier": "frontend"}, map[string]string{"tier": "backend"}))
	p := waitRoutingPolicy(t, c, "front-to-back", []string{"front"}, []string{"back-a", "back-b"},
		metav1.ConditionTrue, controller.ReasonAccepted)

	// `kubectl get nrp`: the server's table names the matched networks
	// and the readiness.
	table := getTable(t, env.Config, "/apis/"+lacev1.GroupVersion.Group+"/"+lacev1.GroupVersion.Version+"/networkroutingpolicies")
	var cols []string
	for _, col := range table.ColumnDefinitions {
		cols = append(cols, col.Name)
	}
	if want := []string{"Name", "Sources", "Destinations", "Ready", "Reason", "Age"}; !slices.Equal(cols, want) {
		t.Errorf("columns %v, want %v", cols, want)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("table rows %+v, want one", table.Rows)
	}
	row := fmt.Sprint(table.Rows[0].Cells)
	for _, s := range []string{"front-to-back", "front", "back-a", "back-b", "True", controller.ReasonAccepted} {
		if !strings.Contains(row, s) {
			t.Errorf("table row %s does not show %q", row, s)
		}
	}

	// Network status churn that changes nothing the policy reads (an
	// annotation, blocks) passes no write on; a label that moves a network
	// out of the destinations does, and the policy follows it.
	var nw lacev1.Network
	if err := c.Get(ctx, client.ObjectKey{Name: "back-b"}, &nw); err != nil {
		t.Fatal(err)
	}
	nw.Annotations = map[string]string{"note": "unrelated"}
	if err := c.Update(ctx, &nw); err != nil {
		t.Fatal(err)
	}
	nw.Labels["tier"] = "storage"
	if err := c.Update(ctx, &nw); err != nil {
		t.Fatal(err)
	}
	waitRoutingPolicy(t, c, "front-to-back", []string{"front"}, []string{"back-a"}, metav1.ConditionTrue, controller.ReasonAccepted)

	// A network that goes leaves the matches too.
	if err := c.Delete(ctx, &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: "back-a"}}); err != nil {
		t.Fatal(err)
	}
	after := waitRoutingPolicy(t, c, "front-to-back", []string{"front"}, nil, metav1.ConditionFalse, controller.ReasonNoDestinationNetworks)
	if after.Generation != p.Generation {
		t.Errorf("the controller changed the policy's spec: generation %d -> %d", p.Generation, after.Generation)
	}
	waitPolicyEvent(t, c, "front-to-back", controller.ReasonNoDestinationNetworks)
}

func TestRoutingPolicySelectingNothingWarns(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, nil)
	c := env.Client
	ctx := context.Background()
	create(t, c, labelled(l3Network("red", "10.60.0.0/16", "", 24, 0), "tier", "frontend"))
	waitNetworkIDs(t, c, "red")

	create(t, c, routingPolicy("typo", map[string]string{"tier": "frontedn"}, map[string]string{"tier": "backend"}))
	waitRoutingPolicy(t, c, "typo", nil, nil, metav1.ConditionFalse, controller.ReasonNoSourceNetworks)
	waitPolicyEvent(t, c, "typo", controller.ReasonNoSourceNetworks, "srcSelector")

	create(t, c, routingPolicy("nowhere", map[string]string{"tier": "frontend"}, map[string]string{"tier": "backend"}))
	waitRoutingPolicy(t, c, "nowhere", []string{"red"}, nil, metav1.ConditionFalse, controller.ReasonNoDestinationNetworks)
	waitPolicyEvent(t, c, "nowhere", controller.ReasonNoDestinationNetworks, "destSelector")

	// The missing destination appears: the policy turns Ready once the
	// network has its ID, without anyone touching the policy.
	create(t, c, labelled(l3Network("blue", "10.61.0.0/16", "", 24, 0), "tier", "backend"))
	waitRoutingPolicy(t, c, "nowhere", []string{"red"}, []string{"blue"}, metav1.ConditionTrue, controller.ReasonAccepted)

	// Fixing the typo (a spec change) is picked up too.
	var p lacev1.NetworkRoutingPolicy
	if err := c.Get(ctx, client.ObjectKey{Name: "typo"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.SrcSelector.MatchLabels["tier"] = "frontend"
	if err := c.Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
	waitRoutingPolicy(t, c, "typo", []string{"red"}, []string{"blue"}, metav1.ConditionTrue, controller.ReasonAccepted)

	// One Event per transition, not one per reconcile: the network events
	// above re-reconciled "typo" while it selected nothing.
	for _, reason := range []string{controller.ReasonNoSourceNetworks} {
		for _, e := range policyEvents(t, c, "typo", reason) {
			if e.Count > 1 {
				t.Errorf("%s event on typo emitted %d times: %s", reason, e.Count, e.Message)
			}
		}
	}
}

func TestRoutingPolicyPeeringConflict(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, nil)
	c := env.Client
	ctx := context.Background()
	// b overlaps a; c overlaps neither.
	create(t, c, labelled(l3Network("a", "10.40.0.0/16", "", 24, 0), "vrf", "prod"))
	create(t, c, labelled(l3Network("b", "10.40.128.0/17", "", 24, 0), "vrf", "prod"))
	create(t, c, labelled(l3Network("c", "10.41.0.0/16", "", 24, 0), "vrf", "prod"))
	waitNetworkIDs(t, c, "a", "b", "c")
	create(t, c, routingPolicy("mesh", map[string]string{"vrf": "prod"}, map[string]string{"vrf": "prod"}))

	all := []string{"a", "b", "c"}
	p := waitRoutingPolicy(t, c, "mesh", all, all, metav1.ConditionFalse, controller.ReasonPeeringConflict)
	msg := meta.FindStatusCondition(p.Status.Conditions, lacev1.ConditionReady).Message
	// Refused both ways: a's view keeps a, b's view keeps b.
	for _, s := range []string{"a -> b", "b -> a", "10.40.0.0/16", "10.40.128.0/17"} {
		if !strings.Contains(msg, s) {
			t.Errorf("PeeringConflict message %q does not name %q", msg, s)
		}
	}
	if strings.Contains(msg, "-> c") {
		t.Errorf("PeeringConflict message %q refuses c, which overlaps nothing", msg)
	}
	waitPolicyEvent(t, c, "mesh", controller.ReasonPeeringConflict, "a -> b", "10.40.128.0/17", "10.40.0.0/16")

	// Moving b out of the mesh resolves the conflict.
	var nw lacev1.Network
	if err := c.Get(ctx, client.ObjectKey{Name: "b"}, &nw); err != nil {
		t.Fatal(err)
	}
	nw.Labels["vrf"] = "dev"
	if err := c.Update(ctx, &nw); err != nil {
		t.Fatal(err)
	}
	waitRoutingPolicy(t, c, "mesh", []string{"a", "c"}, []string{"a", "c"}, metav1.ConditionTrue, controller.ReasonAccepted)
}

// TestRoutingPolicyConflictFollowsOtherPolicies: among peers the earlier
// policy name keeps its place, so a policy is refused because of another
// one, and recovers when that one goes.
func TestRoutingPolicyConflictFollowsOtherPolicies(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, nil)
	c := env.Client
	ctx := context.Background()
	create(t, c, labelled(l3Network("src", "10.70.0.0/16", "", 24, 0), "role", "src"))
	create(t, c, labelled(l3Network("x", "10.80.0.0/16", "", 24, 0), "peer", "x"))
	create(t, c, labelled(l3Network("y", "10.80.0.0/16", "", 24, 0), "peer", "y"))
	waitNetworkIDs(t, c, "src", "x", "y")
	create(t, c, routingPolicy("p1-to-x", map[string]string{"role": "src"}, map[string]string{"peer": "x"}))
	create(t, c, routingPolicy("p2-to-y", map[string]string{"role": "src"}, map[string]string{"peer": "y"}))
	waitRoutingPolicy(t, c, "p1-to-x", []string{"src"}, []string{"x"}, metav1.ConditionTrue, controller.ReasonAccepted)
	p := waitRoutingPolicy(t, c, "p2-to-y", []string{"src"}, []string{"y"}, metav1.ConditionFalse, controller.ReasonPeeringConflict)
	msg := meta.FindStatusCondition(p.Status.Conditions, lacev1.ConditionReady).Message
	if !strings.Contains(msg, "src -> y") || !strings.Contains(msg, "x 10.80.0.0/16") {
		t.Errorf("PeeringConflict message %q does not name y's refusal and x's prefix", msg)
	}
	if err := c.Delete(ctx, &lacev1.NetworkRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p1-to-x"}}); err != nil {
		t.Fatal(err)
	}
	waitRoutingPolicy(t, c, "p2-to-y", []string{"src"}, []string{"y"}, metav1.ConditionTrue, controller.ReasonAccepted)
}

// getTable GETs path as the server-side table kubectl prints.
func getTable(t *testing.T, cfg *rest.Config, path string) *metav1.Table {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("get table %s: %d %v %s", path, resp.StatusCode, err, body)
	}
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatalf("decode table: %v", err)
	}
	return &table
}
