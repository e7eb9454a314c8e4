package nodesync

import (
	"fmt"
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// TestNetworkEndpointKicksWhatMatters: every pod of the cluster has a
// NetworkEndpoint, and a change of one kicks this node's computation only
// when it can change the node's state: the node's own, or one at an
// address a service looked up, before or after the change. Every change
// is recorded all the same, for the next computation to index; one that
// kicked nothing and is at an address looked up since is kicked by
// recheck, once.
func TestNetworkEndpointKicksWhatMatters(t *testing.T) {
	p := nePending{reg: syncedReg{}, node: "n1"}
	kicks := 0
	p.kick = func() { kicks++ }
	h := p.handler()
	ne := func(name, node, addr, rv string) *lacev1.NetworkEndpoint {
		return &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, ResourceVersion: rv},
			Spec: lacev1.NetworkEndpointSpec{Node: node, Addresses: []lacev1.IPAddress{lacev1.IPAddress(addr)}}}
	}
	step := func(what string, want int, f func()) {
		t.Helper()
		before := kicks
		f()
		if got := kicks - before; got != want {
			t.Errorf("%s: %d kicks, want %d", what, got, want)
		}
	}
	endpoint := netip.MustParseAddr("10.1.0.6")
	p.watched.set(endpoint, true)

	elsewhere := ne("other", "n2", "10.1.0.5", "1")
	step("a pod on another node at an address no service reads", 0, func() { h.OnAdd(elsewhere, false) })
	step("one of this node", 1, func() { h.OnAdd(ne("mine", "n1", "10.1.0.7", "1"), false) })
	step("one at an endpoint's address", 1, func() { h.OnAdd(ne("ep", "n2", "10.1.0.6", "1"), false) })
	step("one leaving an endpoint's address", 1, func() { h.OnUpdate(ne("ep", "n2", "10.1.0.6", "1"), ne("ep", "n2", "10.1.0.8", "2")) })
	step("one moving to an endpoint's address", 1, func() { h.OnUpdate(ne("x", "n2", "10.1.0.9", "1"), ne("x", "n2", "10.1.0.6", "2")) })
	step("one gone from an endpoint's address", 1, func() { h.OnDelete(ne("ep", "n2", "10.1.0.6", "3")) })
	step("one gone elsewhere", 0, func() { h.OnDelete(elsewhere) })
	step("one gone, its last state unknown", 1, func() { h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "a/y"}) })
	step("a resync", 0, func() { h.OnUpdate(elsewhere, elsewhere) })

	m, _, err := p.take()
	if err != nil {
		t.Fatal(err)
	}
	nn := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "a", Name: name} }
	if _, ok := m[nn("other")]; len(m) != 5 || !ok || m[nn("other")] != nil || m[nn("x")] == nil || m[nn("ep")] != nil || m[nn("y")] != nil {
		t.Errorf("recorded %v, want the five names, other, ep and y gone", m)
	}

	// A computation took; a change comes at an address it then looks up.
	step("a pod elsewhere, during a computation", 0, func() { h.OnAdd(ne("late", "n2", "10.1.0.10", "1"), false) })
	p.watched.set(netip.MustParseAddr("10.1.0.10"), true)
	step("the computation's recheck", 1, p.recheck)
	step("a second recheck", 0, p.recheck)
	// One recorded quietly before a take is the taken computation's.
	step("a pod elsewhere", 0, func() { h.OnAdd(ne("early", "n2", "10.1.0.11", "1"), false) })
	if _, _, err := p.take(); err != nil {
		t.Fatal(err)
	}
	p.watched.set(netip.MustParseAddr("10.1.0.11"), true)
	step("a recheck after it was taken", 0, p.recheck)

	// A burst of pods elsewhere is indexed every quietMax addresses.
	step("quietMax pods elsewhere", 0, func() {
		for i := range quietMax {
			h.OnAdd(ne(fmt.Sprintf("b%d", i), "n2", fmt.Sprintf("10.2.%d.%d", i>>8, i&255), "1"), false)
		}
	})
	step("one more", 1, func() { h.OnAdd(ne("last", "n2", "10.3.0.1", "1"), false) })
}
