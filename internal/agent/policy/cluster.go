package policy

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/lace-cni/lace/internal/netpol"
	"github.com/lace-cni/lace/internal/netpolapi"
)

// cnpRetry is how often the agent looks for the ClusterNetworkPolicy CRD
// while it is not installed.
const cnpRetry = 30 * time.Second

// watchClusterPolicies watches ClusterNetworkPolicies once their CRD is
// installed (the chart installs it; a cluster may remove it). settled is
// closed once the first attempt knows: watched and synced, or the CRD
// absent. Until then nothing is written: tables written without the
// cluster's ClusterNetworkPolicies (an agent's restart) would open what
// their Deny rules close.
func (e *Enforcer) watchClusterPolicies(ctx context.Context, h toolscache.ResourceEventHandler, settled chan<- struct{}) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(netpolapi.ClusterNetworkPolicyGVK)
	once := func() { close(settled) }
	for {
		inf, err := e.cache.GetInformer(ctx, u, cache.BlockUntilSynced(true))
		if err == nil {
			_, err = inf.AddEventHandler(h)
		}
		if err == nil {
			e.cnpWatched.Store(true)
			if once != nil {
				once()
			}
			e.Kick()
			return
		}
		wait := cnpRetry
		if meta.IsNoMatchError(err) {
			// Not installed: the cluster has none.
			if once != nil {
				once()
				once = nil
			}
		} else if once != nil {
			wait = 5 * time.Second // not known yet: soon again
		}
		e.log.Info("ClusterNetworkPolicies not watched", "err", err, "retry", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// clusterInput adds the ClusterNetworkPolicies and the nodes (their
// labels and addresses, for nodes peers) to in.
func (e *Enforcer) clusterInput(ctx context.Context, in *netpol.Input) error {
	var nodes corev1.NodeList
	if err := e.cache.List(ctx, &nodes); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	in.Nodes = netpolapi.NodesOf(nodes.Items)
	if !e.cnpWatched.Load() {
		return nil
	}
	ul := &unstructured.UnstructuredList{}
	ul.SetGroupVersionKind(netpolapi.ClusterNetworkPolicyListGVK)
	if err := e.cache.List(ctx, ul); err != nil {
		return fmt.Errorf("list cluster network policies: %w", err)
	}
	for i := range ul.Items {
		cp, err := netpolapi.ClusterPolicyOf(&ul.Items[i])
		if err != nil {
			// The API server validates what it stores; a policy
			// that still cannot be read is left out, loudly.
			e.log.Error("ClusterNetworkPolicy not enforced", "err", err)
			continue
		}
		in.ClusterPolicies = append(in.ClusterPolicies, cp)
	}
	return nil
}
