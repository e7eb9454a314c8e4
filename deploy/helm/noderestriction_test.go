package helm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/testutil"
	"github.com/lace-cni/lace/lab/controlplane/cptest"
	"github.com/lace-cni/lace/pkg/scheme"
)

const nodeNameExtra = "authentication.kubernetes.io/node-name"

// The chart restricts each agent to its own node's objects, on every
// write verb its RBAC grants.
func TestAgentNodeRestrictionRendered(t *testing.T) {
	r := mustTemplate(t)
	var p admissionv1.ValidatingAdmissionPolicy
	r.get(t, "ValidatingAdmissionPolicy", "lace-agent-node-restriction", &p)
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
		t.Errorf("failurePolicy %v, want Fail: a policy error must refuse, not admit", p.Spec.FailurePolicy)
	}
	wantUser := "'system:serviceaccount:" + testNamespace + ":lace-agent'"
	if len(p.Spec.MatchConditions) != 1 || !strings.Contains(p.Spec.MatchConditions[0].Expression, wantUser) {
		t.Errorf("matchConditions %+v, want the agent's user %s", p.Spec.MatchConditions, wantUser)
	}
	covered := map[string]bool{}
	for _, rr := range p.Spec.MatchConstraints.ResourceRules {
		for _, res := range rr.Resources {
			for _, op := range rr.Operations {
				covered[res+" "+string(op)] = true
			}
		}
	}
	// Every resource the agent's RBAC lets it write, and every write verb.
	for _, res := range []string{"underlayendpoints", "underlayendpoints/status", "networkendpoints", "leases", "events"} {
		for _, op := range []string{"CREATE", "UPDATE", "DELETE"} {
			if !covered[res+" "+op] {
				t.Errorf("policy does not check %s %s", op, res)
			}
		}
	}
	var b admissionv1.ValidatingAdmissionPolicyBinding
	r.get(t, "ValidatingAdmissionPolicyBinding", "lace-agent-node-restriction", &b)
	if b.Spec.PolicyName != p.Name || !slices.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) {
		t.Errorf("binding %+v, want policy %s with Deny", b.Spec, p.Name)
	}
}

// TestAgentNodeRestrictionAPI installs the chart's agent RBAC and policy in
// a real kube-apiserver and writes as agent n1 (the agent's user with the
// node its pod-bound token names): its own objects pass, n2's are refused
// whatever the verb.
func TestAgentNodeRestrictionAPI(t *testing.T) {
	r := mustTemplate(t)
	env := cptest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := env.Client
	for _, kind := range []string{"Namespace", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		for _, d := range r.kinds(kind) {
			u := &unstructured.Unstructured{Object: d}
			if !strings.HasPrefix(u.GetName(), "lace-agent") && kind != "Namespace" {
				continue
			}
			if err := admin.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("create %s %s: %v", kind, u.GetName(), err)
			}
		}
	}
	as := func(node string) client.Client {
		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + testNamespace + ":lace-agent",
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + testNamespace, "system:authenticated"}}
		if node != "" {
			cfg.Impersonate.Extra = map[string][]string{nodeNameExtra: {node}}
		}
		c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	n1, anon := as("n1"), as("")

	uep := func(name, node, locator string) *lacev1.UnderlayEndpoint {
		return &lacev1.UnderlayEndpoint{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: lacev1.UnderlayEndpointSpec{Node: node, Locator: lacev1.CIDR(locator), Addresses: []lacev1.IPAddress{"fd00::1"}}}
	}
	// A policy takes effect once the API server has compiled it: wait for
	// a dry-run forgery to be refused.
	testutil.Eventually(t, time.Minute, 250*time.Millisecond, "policy in force", func() error {
		return refused(n1.Create(ctx, uep("n2", "n2", ""), client.DryRunAll))
	})

	neps := func(name, node string) *lacev1.NetworkEndpoint {
		return &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{"lace-cni.io/node": node}},
			Spec: lacev1.NetworkEndpointSpec{Network: "default", Node: node, Addresses: []lacev1.IPAddress{"10.0.0.1"}}}
	}
	lease := func(node string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "lace-heartbeats", Name: "lace-agent-" + node},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node)}}
	}
	// n2's objects, as the controller and n2's agent would have written them.
	for _, o := range []client.Object{uep("n2", "n2", "fd00:40:2::/48"), neps("p2", "n2"), lease("n2")} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	mustOK := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v, want allowed", what, err)
		}
	}
	mustRefuse := func(what string, err error) {
		t.Helper()
		if err := refused(err); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}

	// Not even its own UnderlayEndpoint may name a locator: the controller
	// assigns them.
	mustRefuse("n1 creates its UnderlayEndpoint with a locator", n1.Create(ctx, uep("n1", "n1", "fd00:40:2::/48")))

	// Its own objects: as internal/agent writes them.
	own := uep("n1", "n1", "")
	mustOK("n1 creates its UnderlayEndpoint", n1.Create(ctx, own))
	base := own.DeepCopy()
	own.Spec.Zone = "z1"
	mustOK("n1 patches its UnderlayEndpoint", n1.Patch(ctx, own, client.MergeFrom(base)))
	base = own.DeepCopy()
	own.Status.Datapath = &lacev1.DatapathStatus{Endpoints: 1}
	mustOK("n1 patches its UnderlayEndpoint status", n1.Status().Patch(ctx, own, client.MergeFrom(base)))
	ne1 := neps("p1", "n1")
	mustOK("n1 creates a NetworkEndpoint of its node", n1.Create(ctx, ne1))
	mustOK("n1 updates it", n1.Update(ctx, ne1))
	l1 := lease("n1")
	mustOK("n1 creates its Lease", n1.Create(ctx, l1))
	l1.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	mustOK("n1 renews its Lease", n1.Update(ctx, l1))
	mustOK("n1 deletes a NetworkEndpoint of its node", n1.Delete(ctx, ne1))

	// n2's objects: nothing passes.
	mustRefuse("n1 creates an UnderlayEndpoint for n3", n1.Create(ctx, uep("n3", "n3", "")))
	mustRefuse("n1 creates its UnderlayEndpoint naming n3", n1.Create(ctx, uep("n1x", "n3", "")))
	var u2 lacev1.UnderlayEndpoint
	if err := admin.Get(ctx, client.ObjectKey{Name: "n2"}, &u2); err != nil {
		t.Fatal(err)
	}
	patched := func(f func(u *lacev1.UnderlayEndpoint)) (*lacev1.UnderlayEndpoint, client.Patch) {
		u := u2.DeepCopy()
		f(u)
		return u, client.MergeFrom(&u2)
	}
	u, pt := patched(func(u *lacev1.UnderlayEndpoint) { u.Spec.Locator = "fd00:40:1::/48" })
	mustRefuse("n1 rewrites n2's locator", n1.Patch(ctx, u, pt))
	u, pt = patched(func(u *lacev1.UnderlayEndpoint) { u.Spec.Addresses = []lacev1.IPAddress{"fd00::66"} })
	mustRefuse("n1 rewrites n2's addresses", n1.Patch(ctx, u, pt))
	u, pt = patched(func(u *lacev1.UnderlayEndpoint) { u.Status.Datapath = &lacev1.DatapathStatus{Endpoints: 7} })
	mustRefuse("n1 writes n2's status", n1.Status().Patch(ctx, u, pt))
	apply := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": lacev1.GroupVersion.String(), "kind": "UnderlayEndpoint",
		"metadata": map[string]any{"name": "n2"},
		"spec":     map[string]any{"node": "n2", "addresses": []any{"fd00::66"}},
	}}
	mustRefuse("n1 applies n2's UnderlayEndpoint", n1.Patch(ctx, apply, client.Apply, client.FieldOwner("lace-agent"), client.ForceOwnership))
	// Nor its own locator.
	if err := admin.Get(ctx, client.ObjectKey{Name: "n1"}, own); err != nil {
		t.Fatal(err)
	}
	base = own.DeepCopy()
	own.Spec.Locator = "fd00:40:2::/48"
	mustRefuse("n1 takes n2's locator for itself", n1.Patch(ctx, own, client.MergeFrom(base)))

	mustRefuse("n1 creates a NetworkEndpoint of n2", n1.Create(ctx, neps("p3", "n2")))
	mustRefuse("n1 creates a NetworkEndpoint of its node labelled n2", n1.Create(ctx, func() *lacev1.NetworkEndpoint {
		ne := neps("p4", "n1")
		ne.Labels["lace-cni.io/node"] = "n2"
		return ne
	}()))
	var ne2 lacev1.NetworkEndpoint
	if err := admin.Get(ctx, client.ObjectKey{Namespace: "default", Name: "p2"}, &ne2); err != nil {
		t.Fatal(err)
	}
	take := ne2.DeepCopy()
	take.Spec.Node, take.Labels["lace-cni.io/node"] = "n1", "n1"
	mustRefuse("n1 takes over n2's NetworkEndpoint", n1.Update(ctx, take))
	ne2.Spec.Addresses = []lacev1.IPAddress{"10.0.0.66"}
	mustRefuse("n1 rewrites n2's NetworkEndpoint", n1.Update(ctx, ne2.DeepCopy()))
	mustRefuse("n1 deletes n2's NetworkEndpoint", n1.Delete(ctx, &ne2))

	mustRefuse("n1 creates n3's Lease", n1.Create(ctx, lease("n3")))
	var l2 coordinationv1.Lease
	if err := admin.Get(ctx, client.ObjectKey{Namespace: "lace-heartbeats", Name: "lace-agent-n2"}, &l2); err != nil {
		t.Fatal(err)
	}
	l2.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	mustRefuse("n1 renews n2's Lease", n1.Update(ctx, l2.DeepCopy()))
	l2.Spec.HolderIdentity = ptr.To("n1")
	mustRefuse("n1 takes n2's Lease", n1.Update(ctx, l2.DeepCopy()))

	// What the policy cannot stop, since CEL cannot look up the pod, and
	// the consumers answer instead: n1 writing its own objects with
	// anything in them. A NetworkEndpoint of n1 under the name of n2's next
	// pod takes the name (n2's agent cannot create or rewrite it); the
	// model ignores it for n2's pod and lace-controller deletes it
	// (internal/model TestNetworkEndpointSquatIgnored, internal/controller
	// TestForeignNetworkEndpointsDeleted). n1 claiming n2's underlay
	// address passes here and is refused by model.AcceptUnderlays
	// (TestUnderlayClaimOfAnotherNodeRefused).
	n2 := as("n2")
	mustOK("n1 squats the NetworkEndpoint name of n2's next pod", n1.Create(ctx, neps("web-0", "n1")))
	if err := n2.Create(ctx, neps("web-0", "n2")); !apierrors.IsAlreadyExists(err) {
		t.Errorf("n2 creates its pod's NetworkEndpoint over the squat: %v, want AlreadyExists", err)
	}
	var sq lacev1.NetworkEndpoint
	if err := n2.Get(ctx, client.ObjectKey{Namespace: "default", Name: "web-0"}, &sq); err != nil {
		t.Fatal(err)
	}
	sq.Spec.Node, sq.Labels["lace-cni.io/node"] = "n2", "n2"
	mustRefuse("n2 rewrites n1's squat (lace-controller removes it instead)", n2.Update(ctx, &sq))

	// Events: an agent writes its recorder's own (source.component
	// lace-agent/<node>), not another component's.
	ev := func(name, component string) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web-0"},
			Reason:         "X", Message: "m", Type: corev1.EventTypeNormal, Count: 1,
			Source: corev1.EventSource{Component: component}}
	}
	own1 := ev("e-n1", "lace-agent/n1")
	mustOK("n1 creates its own Event", n1.Create(ctx, own1))
	base1 := own1.DeepCopy()
	own1.Count = 2
	mustOK("n1 patches its own Event's count", n1.Patch(ctx, own1, client.MergeFrom(base1)))
	mustRefuse("n1 creates an Event as the kubelet", n1.Create(ctx, ev("e-kubelet", "kubelet")))
	mustRefuse("n1 creates an Event as n2's agent", n1.Create(ctx, ev("e-n2", "lace-agent/n2")))
	other := ev("e-ctrl", "lace-controller")
	if err := admin.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	base2 := other.DeepCopy()
	other.Message = "nothing to see"
	mustRefuse("n1 rewrites the controller's Event", n1.Patch(ctx, other, client.MergeFrom(base2)))
	other = base2.DeepCopy()
	other.Source.Component = "lace-agent/n1"
	mustRefuse("n1 takes over the controller's Event", n1.Patch(ctx, other, client.MergeFrom(base2)))

	// A token that names no node writes nothing.
	mustRefuse("a nodeless agent token creates its own-looking Lease", anon.Create(ctx, lease("n1x")))

	// And n2's objects are as n2 left them.
	if err := admin.Get(ctx, client.ObjectKey{Name: "n2"}, &u2); err != nil {
		t.Fatal(err)
	}
	if u2.Spec.Locator != "fd00:40:2::/48" || !slices.Equal(u2.Spec.Addresses, []lacev1.IPAddress{"fd00::1"}) || u2.Status.Datapath != nil {
		t.Errorf("n2's UnderlayEndpoint changed: %+v %+v", u2.Spec, u2.Status)
	}
}

// refused is nil when err is the policy's refusal: 403 Forbidden from the
// node restriction, not RBAC's.
func refused(err error) error {
	switch {
	case err == nil:
		return errors.New("allowed, want refused by the node restriction")
	case !apierrors.IsForbidden(err):
		return fmt.Errorf("%w: want 403 Forbidden", err)
	case !strings.Contains(err.Error(), "lace-agent-node-restriction"):
		return fmt.Errorf("%w: refused, but not by the node restriction", err)
	}
	return nil
}
