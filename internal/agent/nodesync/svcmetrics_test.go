package nodesync

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestMirrorTimesOnlyChanges: what existed when the agent started
// is not its latency; a slice that changes afterwards reports its trigger
// time once.
func TestMirrorTimesOnlyChanges(t *testing.T) {
	at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	slice := func(rv string, trigger *time.Time) discoveryv1.EndpointSlice {
		s := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{UID: "u1", ResourceVersion: rv}}
		if trigger != nil {
			s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
		}
		return s
	}
	var tr svcMirror
	if got := tr.triggersOf([]discoveryv1.EndpointSlice{slice("1", &at)}); len(got) != 0 {
		t.Fatalf("first sync reported %v", got)
	}
	if got := tr.triggersOf([]discoveryv1.EndpointSlice{slice("1", &at)}); len(got) != 0 {
		t.Fatalf("unchanged slice reported %v", got)
	}
	later := at.Add(time.Second)
	if got := tr.triggersOf([]discoveryv1.EndpointSlice{slice("2", &later)}); len(got) != 1 || !got[0].Equal(later) {
		t.Fatalf("changed slice reported %v, want [%s]", got, later)
	}
	if got := tr.triggersOf([]discoveryv1.EndpointSlice{slice("3", nil)}); len(got) != 0 {
		t.Fatalf("change without a trigger time reported %v", got)
	}
}

// triggersOf resyncs m to the slices (named after their UIDs, of one
// service) and returns the trigger times it recorded.
func (m *svcMirror) triggersOf(sls []discoveryv1.EndpointSlice) []time.Time {
	for i := range sls {
		sls[i].Namespace, sls[i].Name = "ns", string(sls[i].UID)
		sls[i].Labels = map[string]string{discoveryv1.LabelServiceName: "svc"}
	}
	m.resync(nil, ptrs(sls))
	_, trig := m.take(false)
	return trig
}
