package nodesync

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// nePending are the NetworkEndpoints that came, changed or went since the
// desired state was last computed, as the informer's events tell them:
// every pod of the cluster has one, so the computation learns what
// changed from here (serviceCache.indexPods) instead of a pass over all
// of them. Without an informer feeding it (a sync made by a test), the
// computation lists them and diffs instead.
//
// A change kicks a computation only when it can change this node's state:
// a NetworkEndpoint of this node (the sync writes its own again), or one
// at an address some service's result looked up (watched). Every other
// pod of the cluster, created or gone, waits in m for the next
// computation, which indexes it. A change that came while a computation
// ran, at an address that computation then started to look up, is found
// by recheck, which that computation calls when done.
type nePending struct {
	mu  sync.Mutex
	reg toolscache.ResourceEventHandlerRegistration
	m   map[types.NamespacedName]*lacev1.NetworkEndpoint
	// quiet are the addresses of the changes recorded since the last
	// take that kicked nothing.
	quiet []netip.Addr
	// kick asks for a computation once a change is recorded: the
	// controller's own watches may run it before this handler saw the
	// event.
	kick func()
	// node is this node's name; watched the addresses services looked
	// up.
	node    string
	watched watchedAddrs
}

// watchedAddrs are the pod addresses some service's result looked up
// (serviceCache.byAddr's keys), kept where the NetworkEndpoint handler,
// on the informer's goroutine, can ask about them.
type watchedAddrs struct {
	mu sync.Mutex
	m  map[netip.Addr]struct{}
}

func (w *watchedAddrs) set(a netip.Addr, on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !on {
		delete(w.m, a)
		return
	}
	if w.m == nil {
		w.m = map[netip.Addr]struct{}{}
	}
	w.m[a] = struct{}{}
}

func (w *watchedAddrs) anyOf(addrs []netip.Addr) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range addrs {
		if _, ok := w.m[a]; ok {
			return true
		}
	}
	return false
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

// record records ne (nil: gone) as the latest of name k, old being the
// version before it (nil: none known), and kicks a computation when the
// change can matter to this node.
func (p *nePending) record(k types.NamespacedName, old, ne *lacev1.NetworkEndpoint) {
	var addrs []netip.Addr
	mine := false
	for _, v := range []*lacev1.NetworkEndpoint{old, ne} {
		if v != nil {
			addrs = append(addrs, model.NetworkEndpointAddrs(v)...)
			mine = mine || v.Spec.Node == p.node
		}
	}
	p.mu.Lock()
	if p.m == nil {
		p.m = map[types.NamespacedName]*lacev1.NetworkEndpoint{}
	}
	p.m[k] = ne
	// Recorded before the question: a computation that takes after this
	// sees the change, one that took before finds it in quiet.
	kick := mine || p.watched.anyOf(addrs) || len(p.quiet) >= quietMax
	if !kick {
		p.quiet = append(p.quiet, addrs...)
	}
	p.mu.Unlock()
	if kick {
		p.kick()
	}
}

// quietMax is how many addresses of quiet changes make a computation
// anyway: a burst of pods elsewhere is indexed every few thousand, and
// quiet stays small between periodic syncs.
const quietMax = 4096

// recheck kicks a computation when a change recorded quietly since the
// last take is at an address looked up now: the computation that calls
// it took before that change and started to look the address up after
// the handler asked.
func (p *nePending) recheck() {
	p.mu.Lock()
	kick := p.kick != nil && p.watched.anyOf(p.quiet)
	if kick {
		p.quiet = nil
	}
	p.mu.Unlock()
	if kick {
		p.kick()
	}
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
	p.quiet = nil
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
	upsert := func(old, o any) {
		if ne, ok := o.(*lacev1.NetworkEndpoint); ok {
			prev, _ := old.(*lacev1.NetworkEndpoint)
			p.record(types.NamespacedName{Namespace: ne.Namespace, Name: ne.Name}, prev, ne)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { upsert(nil, o) },
		UpdateFunc: func(old, o any) {
			if sameVersion(old, o) {
				return // the informer's resync: nothing changed
			}
			upsert(old, o)
		},
		DeleteFunc: func(o any) {
			n, ok := deletedName(o)
			if !ok {
				return
			}
			if d, unknown := o.(toolscache.DeletedFinalStateUnknown); unknown {
				o = d.Obj
			}
			last, known := o.(*lacev1.NetworkEndpoint)
			if !known {
				// Its addresses are unknown: it may matter.
				p.set(n, nil)
				p.kick()
				return
			}
			p.record(n, last, nil)
		},
	}
}
