package nodesync

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// TestFeedsRecordBeforeKick: each handler has recorded its change when it
// kicks (a computation it starts sees it), a resync with nothing new
// kicks nothing, a slice relabelled moves between services (both
// changed), and a delete the informer missed the end of still counts.
func TestFeedsRecordBeforeKick(t *testing.T) {
	var m svcMirror
	var got [][]svcChange
	m.kick = func() {
		c, _ := m.take(false)
		got = append(got, c)
	}
	svcH, sliceH := m.serviceHandler(), m.sliceHandler().(toolscache.ResourceEventHandlerDetailedFuncs)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web", ResourceVersion: "1"}}
	svcH.OnAdd(svc, false)
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web-1", ResourceVersion: "2",
		Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}}
	sliceH.AddFunc(sl, false)
	sliceH.UpdateFunc(sl, sl) // the informer's resync
	moved := sl.DeepCopy()
	moved.ResourceVersion, moved.Labels[discoveryv1.LabelServiceName] = "3", "api"
	sliceH.UpdateFunc(sl, moved)
	svcH.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "a/web", Obj: svc})

	web, api := model.ServiceKey{Namespace: "a", Name: "web"}, model.ServiceKey{Namespace: "a", Name: "api"}
	want := []map[model.ServiceKey]int{{web: 0}, {web: 1}, {web: 0, api: -1}, {web: -1}}
	if len(got) != len(want) {
		t.Fatalf("%d kicks, want %d (the resync must not kick): %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if len(got[i]) != len(w) {
			t.Fatalf("kick %d saw %+v, want services %v", i, got[i], w)
		}
		for _, c := range got[i] {
			n, ok := w[c.Key]
			if !ok || (n < 0) != (c.Service == nil) || n >= 0 && len(c.Slices) != n {
				t.Fatalf("kick %d saw %+v, want %v (slices per service; -1: no Service)", i, got[i], w)
			}
		}
	}

	// The controller's binding annotations, which the cache transform
	// drops, leave nothing to compute; a label it keeps does not.
	kicks := len(got)
	bound := svc.DeepCopy()
	bound.ResourceVersion, bound.Annotations = "5", map[string]string{lacev1.AnnotationServiceNetwork: "default"}
	a, err := trimService(svc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	b, err := trimService(bound)
	if err != nil {
		t.Fatal(err)
	}
	svcH.OnAdd(a, false)
	svcH.OnUpdate(a, b)
	if len(got) != kicks+1 {
		t.Fatalf("an update of an annotation the agent does not read kicked: %+v", got[kicks:])
	}
	if m.svcs[web] != b {
		t.Fatalf("the mirror kept the old Service beside the informer's new one")
	}
	labelled := b.(*corev1.Service).DeepCopy()
	labelled.ResourceVersion, labelled.Labels = "6", map[string]string{"tier": "web"}
	svcH.OnUpdate(b, labelled)
	if len(got) != kicks+2 || len(got[kicks+1]) != 1 || got[kicks+1][0].Service != labelled {
		t.Fatalf("a label change did not kick with the new Service: %+v", got[kicks:])
	}

	p := nePending{reg: syncedReg{}, node: "n1"}
	kicks = 0
	p.kick = func() {
		kicks++
		if m, _, _ := p.take(); len(m) != 1 {
			t.Fatalf("kick %d before the NetworkEndpoint was recorded: %v", kicks, m)
		}
	}
	h := p.handler()
	ne := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p", ResourceVersion: "1"},
		Spec: lacev1.NetworkEndpointSpec{Node: "n1"}}
	h.OnAdd(ne, false)
	h.OnUpdate(ne, ne)
	h.OnDelete(ne)
	if kicks != 2 {
		t.Fatalf("%d kicks for an add, a resync and a delete, want 2", kicks)
	}
}
