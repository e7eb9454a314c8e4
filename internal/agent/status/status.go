package status

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// statusCheckPeriod is how often the agent compares its data plane summary
// (endpoints, map sizes) with its UnderlayEndpoint's status. The check is
// local (the maps and the cache); the API is written only when the summary
// changed, so an idle node writes nothing.
const statusCheckPeriod = 10 * time.Second

// Run keeps the UnderlayEndpoint's status equal to the data plane
// summary: checked every statusCheckPeriod and soon after each change of
// the node's endpoints (at most once a second), until ctx ends.
func (r *Reporter) Run(ctx context.Context) error {
	t := time.NewTicker(statusCheckPeriod)
	defer t.Stop()
	for {
		if err := r.publishStatus(ctx); err != nil && ctx.Err() == nil {
			r.log.Debug("publish data plane status", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-r.statusKick:
			if !sleepCtx(ctx, time.Second) {
				return nil
			}
		}
	}
}

// Kick asks for an early status check.
func (r *Reporter) Kick() {
	select {
	case r.statusKick <- struct{}{}:
	default:
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// datapathStatus is the status the agent publishes: what an operator needs
// to see in the API, and which changes only when pods, networks or nodes
// do. Counters that move with traffic are metrics (metrics.go), not status.
func datapathStatus(endpoints int, sizes map[string]int) *lacev1.DatapathStatus {
	st := &lacev1.DatapathStatus{Endpoints: int32(endpoints), Maps: make(map[string]int64, len(sizes))}
	for k, v := range sizes {
		st.Maps[k] = int64(v)
	}
	return st
}

// statusChanged reports whether the published status differs from want.
func statusChanged(cur, want *lacev1.DatapathStatus) bool {
	if cur == nil || want == nil {
		return cur != want
	}
	return cur.Endpoints != want.Endpoints || !maps.Equal(cur.Maps, want.Maps)
}

// readyCondition is the Ready condition for health h.
func readyCondition(h nodeHealth) metav1.Condition {
	if h.ok() {
		return metav1.Condition{Type: lacev1.UnderlayReady, Status: metav1.ConditionTrue, Reason: lacev1.ReasonUnderlayReady,
			Message: "the node carries pod traffic"}
	}
	return metav1.Condition{Type: lacev1.UnderlayReady, Status: metav1.ConditionFalse, Reason: h.reason, Message: h.message}
}

// conditionChanged reports whether cur (nil: never published) differs
// from want in anything but its timestamps.
func conditionChanged(cur *metav1.Condition, want metav1.Condition) bool {
	return cur == nil || cur.Status != want.Status || cur.Reason != want.Reason || cur.Message != want.Message
}

// publishStatus writes the data plane summary and the node's Ready
// condition into its UnderlayEndpoint status when they differ from what is
// there, and emits an Event on the Node when Ready changes. It compares
// against the cache: a write the cache has not seen yet can at worst be
// repeated once, never lost.
func (r *Reporter) publishStatus(ctx context.Context) error {
	sizes, err := r.dp.MapSizes()
	if err != nil {
		return err
	}
	want := datapathStatus(r.endpoints(), sizes)
	cond := readyCondition(r.checkHealth())
	var u lacev1.UnderlayEndpoint
	if err := r.client.Get(ctx, types.NamespacedName{Name: r.opts.NodeName}, &u); err != nil {
		return fmt.Errorf("get underlay endpoint: %w", err)
	}
	cur := meta.FindStatusCondition(u.Status.Conditions, lacev1.UnderlayReady)
	condChanged := conditionChanged(cur, cond)
	if !statusChanged(u.Status.Datapath, want) && !condChanged {
		return nil
	}
	patch := client.MergeFrom(u.DeepCopy())
	u.Status.Datapath = want
	meta.SetStatusCondition(&u.Status.Conditions, cond)
	if err := r.client.Status().Patch(ctx, &u, patch); err != nil {
		return fmt.Errorf("patch underlay endpoint status: %w", err)
	}
	r.log.Debug("published data plane status", "endpoints", want.Endpoints, "maps", want.Maps)
	if condChanged {
		r.announce(ctx, cond)
	}
	return nil
}

// announce emits an Event on the Node when its Ready condition changed
// from what this agent last announced: a Warning with the problem's reason
// when the node cannot carry pod traffic, a Normal one when it can again.
// The first report of a healthy node is not news.
func (r *Reporter) announce(ctx context.Context, cond metav1.Condition) {
	r.mu.Lock()
	last := r.reported
	r.reported = &cond
	r.mu.Unlock()
	if last != nil && !conditionChanged(last, cond) {
		return
	}
	r.log.Info("node readiness changed", "ready", cond.Status, "reason", cond.Reason, "message", cond.Message)
	if cond.Status == metav1.ConditionTrue && (last == nil || last.Status == metav1.ConditionTrue) {
		return
	}
	var node corev1.Node
	if err := r.client.Get(ctx, types.NamespacedName{Name: r.opts.NodeName}, &node); err != nil {
		r.log.Info("cannot emit node event", "err", err)
		return
	}
	typ := corev1.EventTypeWarning
	if cond.Status == metav1.ConditionTrue {
		typ = corev1.EventTypeNormal
	}
	r.recorder.Event(&node, typ, cond.Reason, cond.Message)
}
