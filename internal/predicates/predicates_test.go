package predicates

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

func TestNodeHeartbeatDoesNotPass(t *testing.T) {
	base := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "1",
		Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}}
	hb := base.DeepCopy()
	hb.ResourceVersion = "2"
	hb.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now()}}
	hb.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	hb.Spec.Taints = []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectNoSchedule}}
	zone := base.DeepCopy()
	zone.Labels = map[string]string{corev1.LabelTopologyZone: "zone-b"}
	del := base.DeepCopy()
	del.DeletionTimestamp = &metav1.Time{}

	p := NodeChanged()
	for _, c := range []struct {
		name string
		new  *corev1.Node
		want bool
	}{{"heartbeat", hb, false}, {"zone label", zone, true}, {"deletion", del, true}} {
		if got := p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: c.new}); got != c.want {
			t.Errorf("%s: passes=%v, want %v", c.name, got, c.want)
		}
	}
	if !p.Create(event.CreateEvent{Object: base}) || !p.Delete(event.DeleteEvent{Object: base}) {
		t.Error("node creation and deletion must pass")
	}
}

func TestPodUpdate(t *testing.T) {
	base := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", Labels: map[string]string{"app": "a"}},
		Spec:   corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.2"}}}}
	mod := func(f func(*corev1.Pod)) *corev1.Pod { p := base.DeepCopy(); f(p); return p }
	for _, c := range []struct {
		name string
		new  *corev1.Pod
		want bool
	}{
		{"conditions only", mod(func(p *corev1.Pod) {
			p.ResourceVersion = "9"
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", RestartCount: 3}}
			p.Annotations = map[string]string{"a": "b"}
		}), false},
		{"phase", mod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), true},
		{"ips", mod(func(p *corev1.Pod) { p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: "fd00::2"}) }), true},
		{"labels", mod(func(p *corev1.Pod) { p.Labels = map[string]string{"app": "b"} }), true},
		{"node", mod(func(p *corev1.Pod) { p.Spec.NodeName = "n2" }), true},
		{"deletion", mod(func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }), true},
	} {
		if got := PodChanged().Update(event.UpdateEvent{ObjectOld: base, ObjectNew: c.new}); got != c.want {
			t.Errorf("%s: passes=%v, want %v", c.name, got, c.want)
		}
	}
}

func TestSpecOrLifecycleIgnoresStatus(t *testing.T) {
	base := &lacev1.UnderlayEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "n1", Generation: 1}}
	status := base.DeepCopy()
	status.ResourceVersion = "7"
	status.Status.Datapath = &lacev1.DatapathStatus{Endpoints: 3}
	spec := base.DeepCopy()
	spec.Generation = 2
	spec.Spec.Locator = "fd1a:ce::/64"
	del := base.DeepCopy()
	del.DeletionTimestamp = &metav1.Time{}
	lbl := base.DeepCopy()
	lbl.Labels = map[string]string{"a": "b"}
	p := SpecOrLifecycleChanged()
	for _, c := range []struct {
		name string
		new  *lacev1.UnderlayEndpoint
		want bool
	}{{"status only", status, false}, {"spec", spec, true}, {"deletion", del, true}, {"labels", lbl, true}} {
		if got := p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: c.new}); got != c.want {
			t.Errorf("%s: passes=%v, want %v", c.name, got, c.want)
		}
	}
}

func TestExistence(t *testing.T) {
	base := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: "a", Generation: 1}}
	upd := base.DeepCopy()
	upd.Generation = 2
	upd.Status.ID = 4
	del := base.DeepCopy()
	del.DeletionTimestamp = &metav1.Time{}
	p := Existence()
	if p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: upd}) {
		t.Error("an update of a network that exists must not pass")
	}
	if !p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: del}) {
		t.Error("the start of a deletion must pass")
	}
	if !p.Create(event.CreateEvent{Object: base}) || !p.Delete(event.DeleteEvent{Object: base}) {
		t.Error("creation and deletion must pass")
	}
}
