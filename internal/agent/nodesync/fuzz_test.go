package nodesync

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// FuzzLastChangeTriggerTime: the EndpointSlice annotation
// endpoints.kubernetes.io/last-change-trigger-time (RFC 3339 with
// nanoseconds) is the start of the programming latency the agent
// reports. A slice that changed reports its time when the annotation is
// one, and nothing otherwise; a slice that did not change, or one seen
// at the agent's first sync, reports nothing, whatever it says.
func FuzzLastChangeTriggerTime(f *testing.F) {
	for _, v := range []string{"2026-11-21T10:00:00Z", "2026-11-21T10:00:00.123456789+02:00", "2026-11-21T10:00:00", "",
		"0000-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999Z", "2026-02-30T10:00:00Z", "yesterday", "2026-11-21T24:00:00Z"} {
		f.Add("2026-11-21T09:00:00Z", v, true, true)
		f.Add(v, v, false, true)
	}
	f.Add("2026-11-21T09:00:00Z", "2026-11-21T10:00:00Z", true, false)
	f.Fuzz(func(t *testing.T, first, next string, changes, annotated bool) {
		slice := func(uid, rv, trigger string, annotated bool) discoveryv1.EndpointSlice {
			s := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), ResourceVersion: rv}}
			if annotated {
				s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger}
			}
			return s
		}
		var tr svcMirror
		if got := tr.triggersOf([]discoveryv1.EndpointSlice{slice("u1", "1", first, true)}); len(got) != 0 {
			t.Fatalf("the first sync reported %v", got)
		}
		rv := "1"
		if changes {
			rv = "2"
		}
		// A second slice, new since the first sync, always changed.
		got := tr.triggersOf([]discoveryv1.EndpointSlice{slice("u1", rv, next, annotated), slice("u2", "7", next, annotated)})
		var want []time.Time
		if at, err := time.Parse(time.RFC3339Nano, next); err == nil && annotated {
			if changes {
				want = append(want, at)
			}
			want = append(want, at)
		}
		if len(got) != len(want) {
			t.Fatalf("trigger %q (changed %v, annotated %v) reported %v, want %v", next, changes, annotated, got, want)
		}
		for i := range got {
			if !got[i].Equal(want[i]) {
				t.Fatalf("trigger %q reported %v, want %v", next, got, want)
			}
		}
	})
}
