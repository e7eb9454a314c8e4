package agent

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// statusPeriod is how often the agent reports its data plane in its
// UnderlayEndpoint's status (what lacectl status shows).
const statusPeriod = 10 * time.Second

// reportStatus publishes the data plane summary every statusPeriod, and
// soon after each change of the node's endpoints (at most once a second),
// until ctx ends.
func (a *Agent) reportStatus(ctx context.Context) error {
	t := time.NewTicker(statusPeriod)
	defer t.Stop()
	for {
		if err := a.publishStatus(ctx); err != nil && ctx.Err() == nil {
			a.log.Debug("publish data plane status", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-a.statusKick:
			if !sleepCtx(ctx, time.Second) {
				return nil
			}
		}
	}
}

// kickStatus asks for an early status report.
func (a *Agent) kickStatus() {
	select {
	case a.statusKick <- struct{}{}:
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

func (a *Agent) publishStatus(ctx context.Context) error {
	sizes, err := a.dp.MapSizes()
	if err != nil {
		return err
	}
	drops, err := a.dp.Drops()
	if err != nil {
		return err
	}
	fwd, err := a.dp.Forwarded()
	if err != nil {
		return err
	}
	st := &lacev1.DatapathStatus{Endpoints: int32(len(a.cp.all())), UpdatedAt: metav1.Now(),
		Maps: map[string]int64{}, Drops: map[string]int64{}, Forwarded: map[string]int64{}}
	for k, v := range sizes {
		st.Maps[k] = int64(v)
	}
	for k, v := range drops {
		st.Drops[k] = int64(v)
	}
	for k, v := range fwd {
		st.Forwarded[k] = int64(v)
	}
	var u lacev1.UnderlayEndpoint
	if err := a.client.Get(ctx, types.NamespacedName{Name: a.opts.NodeName}, &u); err != nil {
		return fmt.Errorf("get underlay endpoint: %w", err)
	}
	patch := client.MergeFrom(u.DeepCopy())
	u.Status.Datapath = st
	return a.client.Status().Patch(ctx, &u, patch)
}
