package nodesync

import (
	"errors"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// nePending are the NetworkEndpoints that came, changed or went since the
// desired state was last computed, as the informer's events tell them:
// every pod of the cluster has one, so the computation learns what
// changed from here (serviceCache.indexPods) instead of a pass over all
// of them. Without an informer feeding it (a sync made by a test), the
// computation lists them and diffs instead.
type nePending struct {
	mu  sync.Mutex
	reg toolscache.ResourceEventHandlerRegistration
	m   map[types.NamespacedName]*lacev1.NetworkEndpoint
}

// errNEsNotSynced: the informer's handler has not seen every
// NetworkEndpoint yet; the computation waits rather than judge services'
// endpoints by part of them.
var errNEsNotSynced = errors.New("the NetworkEndpoints are not all known yet")

// set records ne (nil: gone) as the latest of name k.
func (p *nePending) set(k types.NamespacedName, ne *lacev1.NetworkEndpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[types.NamespacedName]*lacev1.NetworkEndpoint{}
	}
	p.m[k] = ne
}

// take returns what was recorded since the last take; live is false when
// no informer feeds p.
func (p *nePending) take() (m map[types.NamespacedName]*lacev1.NetworkEndpoint, live bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reg == nil {
		return nil, false, nil
	}
	if !p.reg.HasSynced() {
		return nil, true, errNEsNotSynced
	}
	m, p.m = p.m, nil
	return m, true, nil
}

// register feeds p from inf's events: its handler is given every object
// the informer holds, then every change.
func (p *nePending) register(inf interface {
	AddEventHandler(toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error)
}) error {
	reg, err := inf.AddEventHandler(p.handler())
	if err != nil {
		return fmt.Errorf("watch NetworkEndpoints: %w", err)
	}
	p.mu.Lock()
	p.reg = reg
	p.mu.Unlock()
	return nil
}

func (p *nePending) handler() toolscache.ResourceEventHandler {
	upsert := func(o any) {
		if ne, ok := o.(*lacev1.NetworkEndpoint); ok {
			p.set(types.NamespacedName{Namespace: ne.Namespace, Name: ne.Name}, ne)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    upsert,
		UpdateFunc: func(_, o any) { upsert(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				if ns, name, err := toolscache.SplitMetaNamespaceKey(d.Key); err == nil {
					p.set(types.NamespacedName{Namespace: ns, Name: name}, nil)
				}
				return
			}
			if ne, ok := o.(*lacev1.NetworkEndpoint); ok {
				p.set(types.NamespacedName{Namespace: ne.Namespace, Name: ne.Name}, nil)
			}
		},
	}
}
