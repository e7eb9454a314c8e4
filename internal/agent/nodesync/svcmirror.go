package nodesync

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/lace-cni/lace/internal/model"
)

// svcMirror holds the cluster's Services and EndpointSlices by service,
// as the informers' events give them (the informers' own objects, never
// modified), and which services changed since the computation last took
// them (serviceCache.update): an endpoint change costs the service it
// belongs to, with no pass over the others. Without informers (a sync made
// by a test), resync diffs full lists into it instead.
type svcMirror struct {
	mu   sync.Mutex
	regs []toolscache.ResourceEventHandlerRegistration
	svcs map[model.ServiceKey]*corev1.Service
	// slices are by the namespace and kubernetes.io/service-name label
	// they carry (whatever else they say: model.SliceService filters),
	// sorted by name: most services have one, and a map of one per
	// service cost 10,000 small maps (about 2.5 MB); sliceKey is where
	// each slice is filed.
	slices   map[model.ServiceKey][]*discoveryv1.EndpointSlice
	sliceKey map[types.NamespacedName]model.ServiceKey
	dirty    map[model.ServiceKey]bool
	// triggers are the last-change-trigger-times of the slices that
	// changed since the last take (none of what existed at start: that
	// is not the agent's latency).
	triggers []time.Time
	primed   bool
	kick     func()
}

// maxTriggers bounds the trigger times kept for the programming latency
// while no computation takes them (informers not synced, computations
// failing): the metric loses samples, the agent no memory.
const maxTriggers = 4096

// kubernetesService is the API server's Service, whose endpoints are
// reserved addresses and ports (model.ReservedHosts, hostPorts).
var kubernetesService = model.ServiceKey{Namespace: metav1.NamespaceDefault, Name: "kubernetes"}

func (m *svcMirror) init() {
	if m.svcs == nil {
		m.svcs, m.slices = map[model.ServiceKey]*corev1.Service{}, map[model.ServiceKey][]*discoveryv1.EndpointSlice{}
		m.sliceKey, m.dirty = map[types.NamespacedName]model.ServiceKey{}, map[model.ServiceKey]bool{}
	}
}

// setService records svc (nil: gone) as the Service k. The caller holds mu.
func (m *svcMirror) setService(k model.ServiceKey, svc *corev1.Service) {
	m.init()
	if svc == nil {
		delete(m.svcs, k)
	} else {
		m.svcs[k] = svc
	}
	m.dirty[k] = true
}

// setSlice records sl (nil: gone) as the EndpointSlice n, and its trigger
// time when it is a change the agent should be timed on. The caller holds
// mu.
func (m *svcMirror) setSlice(n types.NamespacedName, sl *discoveryv1.EndpointSlice, timed bool) {
	m.init()
	if old, ok := m.sliceKey[n]; ok {
		if i, ok := m.find(old, n.Name); ok {
			m.slices[old] = slices.Delete(m.slices[old], i, i+1)
		}
		if len(m.slices[old]) == 0 {
			delete(m.slices, old)
		}
		delete(m.sliceKey, n)
		m.dirty[old] = true
	}
	if sl == nil {
		return
	}
	name := sl.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return // nobody's
	}
	k := model.ServiceKey{Namespace: sl.Namespace, Name: name}
	if i, ok := m.find(k, n.Name); ok {
		m.slices[k][i] = sl
	} else {
		m.slices[k] = slices.Insert(m.slices[k], i, sl)
	}
	m.sliceKey[n] = k
	m.dirty[k] = true
	if v, ok := sl.Annotations[corev1.EndpointsLastChangeTriggerTime]; ok && timed && len(m.triggers) < maxTriggers {
		if at, err := time.Parse(time.RFC3339Nano, v); err == nil {
			m.triggers = append(m.triggers, at)
		}
	}
}

// svcChange is one service as it is now: Service nil when it is gone,
// Slices its EndpointSlices (model.SliceService's) by name.
type svcChange struct {
	Key     model.ServiceKey
	Service *corev1.Service
	Slices  []*discoveryv1.EndpointSlice
}

// synced fails with errNotSynced while an informer's handler has not
// seen every object yet: the computation waits rather than judge by part
// of them.
func (m *svcMirror) synced() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.regs {
		if !r.HasSynced() {
			return errNotSynced
		}
	}
	return nil
}

// live: informers feed m.
func (m *svcMirror) live() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.regs) > 0
}

// register feeds m from the Services' and the EndpointSlices' informers,
// kicking a computation after each change.
func (m *svcMirror) register(svcs, slices informer, kick func()) error {
	m.kick = kick
	r1, err := svcs.AddEventHandler(m.serviceHandler())
	if err != nil {
		return fmt.Errorf("watch Services: %w", err)
	}
	r2, err := slices.AddEventHandler(m.sliceHandler())
	if err != nil {
		return fmt.Errorf("watch EndpointSlices: %w", err)
	}
	m.mu.Lock()
	m.regs = append(m.regs, r1, r2)
	m.mu.Unlock()
	return nil
}

// take returns the services that changed since the last take (every
// service when all), in no order, and the trigger times of the slice
// changes among them; it forgets both.
func (m *svcMirror) take(all bool) ([]svcChange, []time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	keys := m.dirty
	if all {
		keys = make(map[model.ServiceKey]bool, len(m.svcs)+len(m.dirty))
		maps.Copy(keys, m.dirty)
		for k := range m.svcs {
			keys[k] = true
		}
	}
	out := make([]svcChange, 0, len(keys))
	for k := range keys {
		c := svcChange{Key: k, Service: m.svcs[k]}
		if c.Service != nil {
			c.Slices = m.group(k, true)
		}
		out = append(out, c)
	}
	trig := m.triggers
	m.dirty, m.triggers = map[model.ServiceKey]bool{}, nil
	return out, trig
}

// current is service k as the mirror has it now (nil: gone) and its
// served EndpointSlices.
func (m *svcMirror) current(k model.ServiceKey) (*corev1.Service, []*discoveryv1.EndpointSlice) {
	m.mu.Lock()
	defer m.mu.Unlock()
	svc := m.svcs[k]
	if svc == nil {
		return nil, nil
	}
	return svc, m.group(k, true)
}

// group is service k's EndpointSlices by name: only model.SliceService's
// when served, else all that name it. The caller holds mu.
func (m *svcMirror) group(k model.ServiceKey, served bool) []*discoveryv1.EndpointSlice {
	g := make([]*discoveryv1.EndpointSlice, 0, len(m.slices[k]))
	for _, sl := range m.slices[k] {
		if _, ok := model.SliceService(sl); ok || !served {
			g = append(g, sl)
		}
	}
	return g
}

// find is where the slice named name is among service k's (or would be).
// The caller holds mu.
func (m *svcMirror) find(k model.ServiceKey, name string) (int, bool) {
	return slices.BinarySearchFunc(m.slices[k], name, func(sl *discoveryv1.EndpointSlice, name string) int {
		return cmp.Compare(sl.Name, name)
	})
}

// kubernetesSlices are the EndpointSlices of the API server's Service.
func (m *svcMirror) kubernetesSlices() []*discoveryv1.EndpointSlice {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.group(kubernetesService, false)
}

// resync brings the mirror to full lists of the Services and
// EndpointSlices (pointers to objects that are replaced, never modified),
// marking what differs: the sync of a test, which has no informers. The
// first one records no trigger times.
func (m *svcMirror) resync(svcs []*corev1.Service, all []*discoveryv1.EndpointSlice) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	seen := make(map[model.ServiceKey]bool, len(svcs))
	for _, svc := range svcs {
		k := model.ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
		if seen[k] {
			continue // listed twice: the first one counts
		}
		seen[k] = true
		if old := m.svcs[k]; old == nil || changedObject(old, svc) {
			m.setService(k, svc)
		}
	}
	for k := range m.svcs {
		if !seen[k] {
			m.setService(k, nil)
		}
	}
	seenSlices := make(map[types.NamespacedName]bool, len(all))
	for _, sl := range all {
		n := types.NamespacedName{Namespace: sl.Namespace, Name: sl.Name}
		if seenSlices[n] {
			continue
		}
		seenSlices[n] = true
		k, filed := m.sliceKey[n]
		i, ok := m.find(k, n.Name)
		if !filed || !ok || changedObject(m.slices[k][i], sl) {
			m.setSlice(n, sl, m.primed)
		}
	}
	for n := range m.sliceKey {
		if !seenSlices[n] {
			m.setSlice(n, nil, false)
		}
	}
	m.primed = true
}

// changedObject: b is not the object a was (another version or UID).
func changedObject(a, b metav1.Object) bool {
	return a.GetResourceVersion() != b.GetResourceVersion() || a.GetUID() != b.GetUID()
}

// serviceHandler and sliceHandler feed m from the Services' and the
// EndpointSlices' informers, and kick a computation after each change:
// the controller's own watches may run one before they saw the event.
func (m *svcMirror) serviceHandler() toolscache.ResourceEventHandler {
	set := func(n types.NamespacedName, svc *corev1.Service) {
		m.mu.Lock()
		m.setService(model.ServiceKey{Namespace: n.Namespace, Name: n.Name}, svc)
		m.mu.Unlock()
		m.kick()
	}
	upsert := func(o any) {
		if svc, ok := o.(*corev1.Service); ok {
			set(types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}, svc)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: upsert,
		UpdateFunc: func(old, o any) {
			switch {
			case sameVersion(old, o):
			case sameTrimmedService(old, o):
				// Nothing to compute; the new object replaces the old
				// in the mirror, so that the informer's store and the
				// mirror do not hold two copies.
				svc := o.(*corev1.Service)
				k := model.ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
				m.mu.Lock()
				if _, ok := m.svcs[k]; ok {
					m.svcs[k] = svc
				}
				m.mu.Unlock()
			default:
				upsert(o)
			}
		},
		DeleteFunc: func(o any) {
			if n, ok := deletedName(o); ok {
				set(n, nil)
			}
		},
	}
}

// sameTrimmedService tells whether two versions of a Service, as the cache
// transform left them (trimService), differ in their resourceVersion
// alone: an update that changed nothing the agent reads. The controller
// annotates every new Service with its binding, and each of those writes
// would otherwise recompute the Service on every node (10,000 Services
// created at once: 10,000 more computations per node).
func sameTrimmedService(old, o any) bool {
	a, ok1 := old.(*corev1.Service)
	b, ok2 := o.(*corev1.Service)
	if !ok1 || !ok2 {
		return false
	}
	ac, bc := *a, *b
	ac.ResourceVersion, bc.ResourceVersion = "", ""
	return equality.Semantic.DeepEqual(&ac, &bc)
}

func (m *svcMirror) sliceHandler() toolscache.ResourceEventHandler {
	set := func(n types.NamespacedName, sl *discoveryv1.EndpointSlice, timed bool) {
		m.mu.Lock()
		m.setSlice(n, sl, timed)
		m.mu.Unlock()
		m.kick()
	}
	upsert := func(o any, timed bool) {
		if sl, ok := o.(*discoveryv1.EndpointSlice); ok {
			set(types.NamespacedName{Namespace: sl.Namespace, Name: sl.Name}, sl, timed)
		}
	}
	return toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(o any, initial bool) { upsert(o, !initial) },
		UpdateFunc: func(old, o any) {
			if !sameVersion(old, o) {
				upsert(o, true)
			}
		},
		DeleteFunc: func(o any) {
			if n, ok := deletedName(o); ok {
				set(n, nil, false)
			}
		},
	}
}
