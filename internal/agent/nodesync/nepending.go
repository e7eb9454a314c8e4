package nodesync

import (
	"errors"
	"fmt"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// kick asks for a computation once a change is recorded: the
	// controller's own watches may run it before this handler saw the
	// event.
	kick func()
}

// errNotSynced: an informer's handler has not seen every object yet; the
// computation waits rather than judge by part of them.
var errNotSynced = errors.New("the informers' handlers have not seen every object yet")

// sameVersion: an update event between two versions that are one (the
// informer's periodic resync).
func sameVersion(old, o any) bool {
	a, ok1 := old.(metav1.Object)
	b, ok2 := o.(metav1.Object)
	return ok1 && ok2 && a.GetResourceVersion() == b.GetResourceVersion()
}

// deletedName is the name of a deleted object as a delete event gives it.
func deletedName(o any) (types.NamespacedName, bool) {
	if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		ns, name, err := toolscache.SplitMetaNamespaceKey(d.Key)
		return types.NamespacedName{Namespace: ns, Name: name}, err == nil
	}
	if m, ok := o.(metav1.Object); ok {
		return types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}, true
	}
	return types.NamespacedName{}, false
}

// informer is what the handlers are registered with.
type informer interface {
	AddEventHandler(toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error)
}

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
		return nil, true, errNotSynced
	}
	m, p.m = p.m, nil
	return m, true, nil
}

// register feeds p from inf's events: its handler is given every object
// the informer holds, then every change, and kicks after each.
func (p *nePending) register(inf informer, kick func()) error {
	p.kick = kick
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
			p.kick()
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: upsert,
		UpdateFunc: func(old, o any) {
			if sameVersion(old, o) {
				return // the informer's resync: nothing changed
			}
			upsert(o)
		},
		DeleteFunc: func(o any) {
			if n, ok := deletedName(o); ok {
				p.set(n, nil)
				p.kick()
			}
		},
	}
}
