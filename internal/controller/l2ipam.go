package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model/ipam"
)

// endpointIndex and claimIndex index Neighbors and FDBEntries by the
// endpoint (AnnotationEndpoint) or IPAMClaim (AnnotationIPAMClaim) they
// are held for.
const (
	endpointIndex = "lace.endpoint"
	claimIndex    = "lace.ipamclaim"
)

// l2Retry is how often an endpoint that could not be given its addresses
// (exhausted, taken, its claim missing) tries again.
const l2Retry = 5 * time.Second

// Reasons of condition AddressesAllocated.
const (
	ReasonNotBound             = "NotBoundToNetwork"
	ReasonAddressTaken         = "AddressTaken"
	ReasonInvalidRequest       = "InvalidAddressRequest"
	ReasonIPAMClaimNotFound    = "IPAMClaimNotFound"
	ReasonIPAMClaimWrongTarget = "IPAMClaimNetworkMismatch"
)

// L2AddressReconciler is the global IPAM of l2 networks: it gives each
// NetworkEndpoint of an l2 network an address per family of the network
// and a MAC, and takes them back when the endpoint goes.
//
// Each address is held by a Neighbor and each MAC by an FDBEntry whose
// name is derived from the address or MAC (ipam.NeighborName,
// ipam.FDBEntryName): creating the object is the claim, and the API
// server's AlreadyExists is the only arbiter. So no address or MAC is ever
// given twice, whatever a stale cache, a restart or a second controller
// believes; the cache only says where to start looking. What was assigned
// goes to the endpoint's status (the agent reads it at CNI ADD and
// records it in the spec it owns), with condition AddressesAllocated.
//
// The objects are held for the endpoint, or, when its pod names an
// IPAMClaim, for the claim (l2claims.go), which outlives the pod: the
// next pod naming it gets the same addresses and MAC.
//
// Neighbors and FDBEntries are cluster-scoped and cannot be owned by a
// namespaced object, so they carry their holder's UID (a label) and
// namespace/name (an annotation), and are deleted when it is gone or
// replaced: every Neighbor and FDBEntry event maps to its holder, so
// orphans left while the controller was down are swept when it starts.
type L2AddressReconciler struct {
	Client client.Client
	// APIReader reads pods and claims: a pod created a moment ago must be
	// seen, and the controller caches only hostNetwork pods.
	APIReader client.Reader
	Recorder  record.EventRecorder
}

// SetupWithManager registers the reconciler with one worker: two
// endpoints never search at the same time (the claim would still hold;
// one worker only avoids wasted tries).
func (r *L2AddressReconciler) SetupWithManager(mgr ctrl.Manager) error {
	for _, o := range []client.Object{&lacev1.Neighbor{}, &lacev1.FDBEntry{}} {
		for index, key := range map[string]string{endpointIndex: lacev1.AnnotationEndpoint, claimIndex: lacev1.AnnotationIPAMClaim} {
			if err := mgr.GetFieldIndexer().IndexField(context.Background(), o, index, func(o client.Object) []string {
				if k := o.GetAnnotations()[key]; k != "" {
					return []string{k}
				}
				return nil
			}); err != nil {
				return fmt.Errorf("index %T by %s: %w", o, key, err)
			}
		}
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &lacev1.FDBEntry{}, standbyIndex, func(o client.Object) []string {
		if k := o.GetAnnotations()[lacev1.AnnotationStandbyEndpoint]; k != "" {
			return []string{k}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index FDBEntries by standby: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("l2address").
		For(&lacev1.NetworkEndpoint{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Learned objects are L2LearnReconciler's: a port's learning
		// never costs this one-worker allocator a reconcile.
		Watches(&lacev1.Neighbor{}, toHolder(lacev1.AnnotationEndpoint), builder.WithPredicates(notLearned)).
		Watches(&lacev1.FDBEntry{}, toHolder(lacev1.AnnotationEndpoint), builder.WithPredicates(notLearned)).
		// A standby whose endpoint went while the controller was down is
		// ended when it starts.
		Watches(&lacev1.FDBEntry{}, toHolder(lacev1.AnnotationStandbyEndpoint), builder.WithPredicates(notLearned)).
		Watches(&lacev1.NetworkEndpoint{}, siblingsOf(r.Client)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
}

// notLearned passes the Neighbors and FDBEntries lace-controller
// assigned.
var notLearned = predicate.NewPredicateFuncs(func(o client.Object) bool { return !isLearned(o) })

// isLearned tells whether o is a learned Neighbor or FDBEntry.
func isLearned(o runtime.Object) bool {
	switch x := o.(type) {
	case *lacev1.Neighbor:
		return x.Spec.Learned
	case *lacev1.FDBEntry:
		return x.Spec.Learned
	}
	return false
}

// toHolder maps a Neighbor or FDBEntry to the namespace/name in its
// annotation key.
func toHolder(key string) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		ns, name, ok := strings.Cut(o.GetAnnotations()[key], "/")
		if !ok {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
	})
}

// Reconcile implements reconcile.Reconciler.
func (r *L2AddressReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var ne lacev1.NetworkEndpoint
	err := r.Client.Get(ctx, req.NamespacedName, &ne)
	if apierrors.IsNotFound(err) || (err == nil && ne.DeletionTimestamp != nil) {
		if err := dropStandby(ctx, r.Client, req.String()); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, release(ctx, r.Client, endpointIndex, req.String(), "")
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("get NetworkEndpoint %s: %w", req, err)
	}
	// What an earlier endpoint of this name held goes first.
	if err := release(ctx, r.Client, endpointIndex, req.String(), ne.UID); err != nil {
		return reconcile.Result{}, err
	}
	var nw lacev1.Network
	if err := r.Client.Get(ctx, client.ObjectKey{Name: ne.Spec.Network}, &nw); err != nil {
		// No such network: the agent refuses the pod; nothing to assign.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if nw.Spec.Type != lacev1.NetworkTypeL2 || nw.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	if nw.Status.ID == 0 {
		return reconcile.Result{RequeueAfter: time.Second}, nil // the network controller names it first
	}
	var pod corev1.Pod
	if err := r.APIReader.Get(ctx, req.NamespacedName, &pod); err != nil {
		// No pod: the foreign endpoint reconciler deletes the endpoint.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	// Only the record of this pod, written by the agent of the pod's own
	// node: another node's agent may write an endpoint of any name for its
	// node (the foreign endpoint reconciler deletes it), and must not get
	// addresses, nor move a claim's MAC, through it.
	if ne.Labels[lacev1.LabelPodUID] != string(pod.UID) || pod.Spec.NodeName != ne.Spec.Node {
		return reconcile.Result{}, nil
	}
	var h holder
	var rq request
	var why *refusal
	if len(ne.Status.Addresses) > 0 {
		// The pod has run with these since: they stay its own whatever
		// its annotations or its claim become.
		h, rq, why, err = r.pinned(ctx, &ne, &nw)
		if err == nil && why == nil && h.uid == "" {
			return reconcile.Result{RequeueAfter: time.Second}, nil // its claim's objects are being handed over
		}
	} else {
		h, rq, why, err = r.firstHolder(ctx, &ne, &pod, &nw)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	if why != nil {
		return reconcile.Result{RequeueAfter: l2Retry}, r.report(ctx, &ne, nil, nil, metav1.ConditionFalse, why.reason, why.msg)
	}
	return r.assign(ctx, &ne, &nw, h, rq)
}

// refusal is why an endpoint gets no addresses (condition
// AddressesAllocated False; an endpoint that has some keeps them).
type refusal struct{ reason, msg string }

// request is what a pod asked for: fixed addresses (by family) and MAC.
type request struct {
	addrs map[bool]netip.Addr
	mac   net.HardwareAddr
}

// parseRequest reads the fixed addresses and MAC a pod asks for in nw.
func parseRequest(pod *corev1.Pod, nw *lacev1.Network, claimed []string) (request, *refusal) {
	rq := request{addrs: map[bool]netip.Addr{}}
	var asked []string
	if v := pod.Annotations[lacev1.AnnotationIPAddresses]; v != "" {
		asked = strings.Split(v, ",")
	}
	if len(claimed) > 0 {
		asked = claimed
	}
	for _, s := range asked {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			s = p.Addr().String()
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return rq, &refusal{ReasonInvalidRequest, fmt.Sprintf("%q is not an IP address", s)}
		}
		p, ok := l2Prefix(nw, a.Is4())
		if !ok || !ipam.L2Assignable(p, a) {
			return rq, &refusal{ReasonInvalidRequest, fmt.Sprintf("%s is not an assignable address of network %s (not in its subnet, or its network, gateway or broadcast address)", a, nw.Name)}
		}
		if _, dup := rq.addrs[a.Is4()]; dup {
			return rq, &refusal{ReasonInvalidRequest, fmt.Sprintf("two addresses of one family asked for: %v", asked)}
		}
		rq.addrs[a.Is4()] = a
	}
	if v := pod.Annotations[lacev1.AnnotationMACAddress]; v != "" {
		m, err := net.ParseMAC(v)
		if err != nil || !ipam.L2Claimable(m) {
			return rq, &refusal{ReasonInvalidRequest, fmt.Sprintf("%q is not a MAC an endpoint may ask for (unicast, not zero, not 0a:58-0a:5a, which the IPAM derives)", v)}
		}
		rq.mac = m
	}
	return rq, nil
}

// l2Prefix is nw's subnet of a family.
func l2Prefix(nw *lacev1.Network, is4 bool) (netip.Prefix, bool) {
	s := nw.Spec.IPv6Subnet
	if is4 {
		s = nw.Spec.IPv4Subnet
	}
	if s == nil {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(string(s.Prefix))
	return p.Masked(), err == nil
}

// assign makes sure h holds an address of every family of nw and a MAC
// at ne's node, and reports them in ne's status.
func (r *L2AddressReconciler) assign(ctx context.Context, ne *lacev1.NetworkEndpoint, nw *lacev1.Network, h holder, rq request) (reconcile.Result, error) {
	held, mac, err := heldBy(ctx, r.APIReader, h, nw.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if rq.mac != nil {
		mac = rq.mac
	}
	// A MAC another holds is refused before any address is claimed for
	// it: a Neighbor naming another's MAC must never be left behind.
	if mac != nil {
		why, err := r.macTaken(ctx, h, nw.Name, mac)
		if err != nil {
			return reconcile.Result{}, err
		}
		if why != nil {
			return reconcile.Result{RequeueAfter: l2Retry}, r.report(ctx, ne, nil, nil, metav1.ConditionFalse, why.reason, why.msg)
		}
	}
	for _, is4 := range []bool{true, false} {
		p, ok := l2Prefix(nw, is4)
		if !ok {
			continue
		}
		if _, ok := held[is4]; ok {
			continue
		}
		var a netip.Addr
		var m net.HardwareAddr
		var why *refusal
		if want, ok := rq.addrs[is4]; ok {
			a, m, why, err = r.claimFixed(ctx, h, nw.Name, want, mac)
		} else {
			var onNode map[netip.Addr]bool
			if onNode, err = r.usedOnNode(ctx, ne); err == nil {
				a, m, err = r.claimFree(ctx, h, nw.Name, p, mac, onNode)
			}
			if err == nil && !a.IsValid() {
				why = &refusal{ReasonSubnetExhausted, fmt.Sprintf("network %s has no free %s address (%s: all %d assignable addresses are held)",
					nw.Name, family(p), p, ipam.L2Capacity(p))}
			}
		}
		if err != nil {
			return reconcile.Result{}, err
		}
		if why != nil {
			return reconcile.Result{RequeueAfter: l2Retry}, r.report(ctx, ne, nil, nil, metav1.ConditionFalse, why.reason, why.msg)
		}
		held[is4] = a
		mac = m
	}
	var addrs []netip.Addr
	for _, is4 := range []bool{true, false} {
		if a, ok := held[is4]; ok {
			addrs = append(addrs, a)
		}
	}
	why, err := r.ensureFDB(ctx, &h, ne, nw.Name, mac)
	if err != nil {
		return reconcile.Result{}, err
	}
	if why != nil {
		return reconcile.Result{RequeueAfter: l2Retry}, r.report(ctx, ne, nil, nil, metav1.ConditionFalse, why.reason, why.msg)
	}
	if err := r.recordClaim(ctx, h, nw, addrs); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.report(ctx, ne, addrs, mac, metav1.ConditionTrue, ReasonAllocated, "")
}

func family(p netip.Prefix) string {
	if p.Addr().Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// heldBy returns the addresses (by family: true for IPv4) and the MAC the
// Neighbors of h hold in network.
func heldBy(ctx context.Context, c client.Reader, h holder, network string) (map[bool]netip.Addr, net.HardwareAddr, error) {
	var list lacev1.NeighborList
	if err := c.List(ctx, &list, client.MatchingLabels{h.label: string(h.uid)}); err != nil {
		return nil, nil, fmt.Errorf("list Neighbors of %s: %w", h.key, err)
	}
	held := map[bool]netip.Addr{}
	var mac net.HardwareAddr
	for _, n := range list.Items {
		a, err := netip.ParseAddr(string(n.Spec.Address))
		// A learned binding held for the endpoint is no assignment.
		if err != nil || n.Spec.Network != network || n.DeletionTimestamp != nil || n.Spec.Learned {
			continue
		}
		held[a.Is4()] = a
		if m, err := net.ParseMAC(string(n.Spec.MAC)); err == nil {
			mac = m
		}
	}
	return held, mac, nil
}

// claimFree creates the Neighbor of the lowest free address of p for h,
// with mac (derived from the address when nil); returns the address
// (invalid when p has none free) and the MAC.
// usedOnNode are the addresses the endpoints of other networks hold on
// ne's node: pod addresses are unique per node across networks (the node
// reaches each pod by its address alone), so an l2 network whose subnet
// overlaps another's gives its pod there another address.
func (r *L2AddressReconciler) usedOnNode(ctx context.Context, ne *lacev1.NetworkEndpoint) (map[netip.Addr]bool, error) {
	var list lacev1.NetworkEndpointList
	if err := r.Client.List(ctx, &list, client.MatchingLabels{lacev1.LabelNode: ne.Spec.Node}); err != nil {
		return nil, fmt.Errorf("list NetworkEndpoints of node %s: %w", ne.Spec.Node, err)
	}
	used := map[netip.Addr]bool{}
	for _, o := range list.Items {
		if o.Spec.Network == ne.Spec.Network || o.Spec.Node != ne.Spec.Node {
			continue
		}
		for _, as := range [][]lacev1.IPAddress{o.Spec.Addresses, o.Status.Addresses} {
			for _, s := range as {
				if a, err := netip.ParseAddr(string(s)); err == nil {
					used[a] = true
				}
			}
		}
	}
	return used, nil
}

func (r *L2AddressReconciler) claimFree(ctx context.Context, h holder, network string, p netip.Prefix, mac net.HardwareAddr, onNode map[netip.Addr]bool) (netip.Addr, net.HardwareAddr, error) {
	var list lacev1.NeighborList
	if err := r.Client.List(ctx, &list, client.MatchingLabels{lacev1.LabelNetwork: network}); err != nil {
		return netip.Addr{}, nil, fmt.Errorf("list Neighbors of network %s: %w", network, err)
	}
	used := map[netip.Addr]bool{}
	for _, n := range list.Items {
		if a, err := netip.ParseAddr(string(n.Spec.Address)); err == nil {
			used[a] = true
		}
	}
	for a, ok := ipam.L2Next(p, netip.Addr{}); ok; a, ok = ipam.L2Next(p, a) {
		if used[a] || onNode[a] {
			continue
		}
		m := mac
		if m == nil {
			var err error
			if m, err = r.freeMAC(ctx, network, a); errors.Is(err, errNoFreeMAC) {
				continue // every MAC near it is held: another address
			} else if err != nil {
				return netip.Addr{}, nil, err
			}
		}
		err := r.Client.Create(ctx, h.neighbor(network, a, m))
		if apierrors.IsAlreadyExists(err) {
			continue // taken since the cache saw it
		}
		if err != nil {
			return netip.Addr{}, nil, fmt.Errorf("claim %s in network %s: %w", a, network, err)
		}
		log.FromContext(ctx).Info("assigned an l2 address", "holder", h.key, "network", network, "address", a, "mac", m)
		return a, m, nil
	}
	return netip.Addr{}, nil, nil
}

// claimFixed creates the Neighbor of address a for h, or refuses when
// another holds it.
func (r *L2AddressReconciler) claimFixed(ctx context.Context, h holder, network string, a netip.Addr, mac net.HardwareAddr) (netip.Addr, net.HardwareAddr, *refusal, error) {
	m := mac
	if m == nil {
		var err error
		if m, err = r.freeMAC(ctx, network, a); err != nil {
			return netip.Addr{}, nil, nil, err
		}
	}
	err := r.Client.Create(ctx, h.neighbor(network, a, m))
	if apierrors.IsAlreadyExists(err) {
		var cur lacev1.Neighbor
		if err := r.Client.Get(ctx, client.ObjectKey{Name: ipam.NeighborName(network, a)}, &cur); err != nil {
			return netip.Addr{}, nil, nil, fmt.Errorf("look up the holder of %s in network %s: %w", a, network, err)
		}
		if cur.Labels[h.label] == string(h.uid) && !cur.Spec.Learned {
			return a, m, nil, nil
		}
		// An assignment takes an address a port only learned.
		if cur.Spec.Learned {
			if err := deleteAsRead(ctx, r.Client, &cur); err != nil {
				return netip.Addr{}, nil, nil, fmt.Errorf("take learned %s of network %s for %s: %w", a, network, h.key, err)
			}
			log.FromContext(ctx).Info("an assignment took a learned l2 address", "holder", h.key, "network", network, "address", a, "learnedBy", holderName(&cur))
			if err := r.Client.Create(ctx, h.neighbor(network, a, m)); err != nil {
				return netip.Addr{}, nil, nil, fmt.Errorf("claim learned %s in network %s: %w", a, network, err)
			}
			return a, m, nil, nil
		}
		return netip.Addr{}, nil, &refusal{ReasonAddressTaken, fmt.Sprintf("%s of network %s is held by %s", a, network, holderName(&cur))}, nil
	}
	if err != nil {
		return netip.Addr{}, nil, nil, fmt.Errorf("claim %s in network %s: %w", a, network, err)
	}
	log.FromContext(ctx).Info("assigned a requested l2 address", "holder", h.key, "network", network, "address", a, "mac", m)
	return a, m, nil, nil
}

// holderName says who holds a Neighbor or FDBEntry, for messages.
func holderName(o client.Object) string {
	if c := o.GetAnnotations()[lacev1.AnnotationIPAMClaim]; c != "" {
		return "IPAMClaim " + c
	}
	if e := o.GetAnnotations()[lacev1.AnnotationEndpoint]; e != "" {
		return "endpoint " + e
	}
	return "object " + o.GetName()
}

// freeMAC returns the MAC derived from a, or a salted one when an
// FDBEntry of another holder has it (an IPv6 address's low 32 bits are
// not unique).
func (r *L2AddressReconciler) freeMAC(ctx context.Context, network string, a netip.Addr) (net.HardwareAddr, error) {
	for salt := uint32(0); salt < 64; salt++ {
		m := ipam.L2MAC(a, salt)
		err := r.Client.Get(ctx, client.ObjectKey{Name: ipam.FDBEntryName(network, m)}, &lacev1.FDBEntry{})
		if apierrors.IsNotFound(err) {
			return m, nil
		}
		if err != nil {
			return nil, fmt.Errorf("look up MAC %s in network %s: %w", m, network, err)
		}
	}
	return nil, fmt.Errorf("%w near %s in network %s", errNoFreeMAC, ipam.L2MAC(a, 0), network)
}

var errNoFreeMAC = errors.New("no free MAC")

// ensureFDB claims mac for h at ne's node; a claim's MAC follows the
// pod that owns the claim, with its sequence one higher. Another pod of
// the claim (a live migration's target) is the MAC's standby until its
// VM shows up there (migrate.go), when it becomes the owner.
func (r *L2AddressReconciler) ensureFDB(ctx context.Context, h *holder, ne *lacev1.NetworkEndpoint, network string, mac net.HardwareAddr) (*refusal, error) {
	name := ipam.FDBEntryName(network, mac)
	var cur lacev1.FDBEntry
	err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &cur)
	if apierrors.IsNotFound(err) {
		err = r.Client.Create(ctx, h.fdbEntry(network, mac, ne.Spec.Node))
		if err == nil {
			return nil, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("claim MAC %s in network %s: %w", mac, network, err)
		}
		err = r.Client.Get(ctx, client.ObjectKey{Name: name}, &cur)
	}
	if err != nil {
		return nil, fmt.Errorf("get FDBEntry %s: %w", name, err)
	}
	// An assignment takes a MAC a port only learned (macTaken let it
	// through): the learned one goes, the assigned one is created with
	// a higher sequence.
	if cur.Spec.Learned {
		if err := deleteAsRead(ctx, r.Client, &cur); err != nil {
			return nil, fmt.Errorf("take learned MAC %s of network %s for %s: %w", mac, network, h.key, err)
		}
		f := h.fdbEntry(network, mac, ne.Spec.Node)
		f.Spec.Sequence = cur.Spec.Sequence + 1
		if err := r.Client.Create(ctx, f); err != nil {
			return nil, fmt.Errorf("claim learned MAC %s in network %s: %w", mac, network, err)
		}
		log.FromContext(ctx).Info("an assignment took a learned l2 MAC", "holder", h.key, "network", network, "mac", mac, "learnedBy", holderName(&cur))
		return nil, nil
	}
	if cur.Labels[h.label] != string(h.uid) {
		return &refusal{ReasonAddressTaken, fmt.Sprintf("MAC %s of network %s is held by %s", mac, network, holderName(&cur))}, nil
	}
	if cur.Spec.Node == ne.Spec.Node {
		return nil, nil
	}
	if !h.owns(ne) {
		if !activated(ne, &cur) {
			return nil, r.standBy(ctx, &cur, ne)
		}
		// Its VM runs here now: the claim follows, and says so first.
		if err := r.setOwner(ctx, h, ne.Name); err != nil {
			return nil, err
		}
	}
	return nil, r.moveFDB(ctx, h, &cur, ne)
}

// macTaken refuses mac for h when another holds it as an assignment (a
// learned MAC an assignment takes, ensureFDB).
func (r *L2AddressReconciler) macTaken(ctx context.Context, h holder, network string, mac net.HardwareAddr) (*refusal, error) {
	var cur lacev1.FDBEntry
	err := r.Client.Get(ctx, client.ObjectKey{Name: ipam.FDBEntryName(network, mac)}, &cur)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up MAC %s in network %s: %w", mac, network, err)
	}
	if cur.Spec.Learned || cur.Labels[h.label] == string(h.uid) {
		return nil, nil
	}
	return &refusal{ReasonAddressTaken, fmt.Sprintf("MAC %s of network %s is held by %s", mac, network, holderName(&cur))}, nil
}

// deleteAsRead deletes o as it was read (its UID and version): one
// changed since is left alone, and the caller tries again.
func deleteAsRead(ctx context.Context, c client.Client, o client.Object) error {
	uid, rv := o.GetUID(), o.GetResourceVersion()
	return client.IgnoreNotFound(c.Delete(ctx, o, client.Preconditions{UID: &uid, ResourceVersion: &rv}))
}

// report writes the assignment and condition AddressesAllocated to ne's
// status, with a Warning Event when it turns False.
func (r *L2AddressReconciler) report(ctx context.Context, ne *lacev1.NetworkEndpoint, addrs []netip.Addr, mac net.HardwareAddr,
	status metav1.ConditionStatus, reason, msg string) error {
	next := ne.DeepCopy()
	if status == metav1.ConditionTrue {
		// A refusal keeps what the endpoint has: its pod runs with them.
		next.Status.Addresses = nil
		for _, a := range addrs {
			next.Status.Addresses = append(next.Status.Addresses, lacev1.IPAddress(a.String()))
		}
		next.Status.MAC = lacev1.MACAddress(mac.String())
	}
	if msg == "" {
		msg = fmt.Sprintf("assigned %v and MAC %s", next.Status.Addresses, next.Status.MAC)
	}
	prev := meta.FindStatusCondition(ne.Status.Conditions, lacev1.ConditionAddressesAllocated)
	meta.SetStatusCondition(&next.Status.Conditions, metav1.Condition{
		Type: lacev1.ConditionAddressesAllocated, Status: status, Reason: reason, Message: msg, ObservedGeneration: ne.Generation,
	})
	if status == metav1.ConditionFalse && (prev == nil || prev.Status != status || prev.Reason != reason) {
		r.Recorder.Event(ne, corev1.EventTypeWarning, reason, msg)
	}
	if equalStatus(ne.Status, next.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, next, client.MergeFrom(ne)); err != nil {
		return fmt.Errorf("report l2 addresses of %s/%s: %w", ne.Namespace, ne.Name, err)
	}
	return nil
}

func equalStatus(a, b lacev1.NetworkEndpointStatus) bool {
	if fmt.Sprint(a.Addresses) != fmt.Sprint(b.Addresses) || a.MAC != b.MAC {
		return false
	}
	ca := meta.FindStatusCondition(a.Conditions, lacev1.ConditionAddressesAllocated)
	cb := meta.FindStatusCondition(b.Conditions, lacev1.ConditionAddressesAllocated)
	return ca != nil && cb != nil && ca.Status == cb.Status && ca.Reason == cb.Reason && ca.Message == cb.Message
}

// release deletes the Neighbors and FDBEntries held (per index) for
// namespace/name key whose holder UID is not keep (all when keep is
// empty).
func release(ctx context.Context, c client.Client, index, key string, keep types.UID) error {
	var nbrs lacev1.NeighborList
	if err := c.List(ctx, &nbrs, client.MatchingFields{index: key}); err != nil {
		return fmt.Errorf("list Neighbors of %s: %w", key, err)
	}
	var fdbs lacev1.FDBEntryList
	if err := c.List(ctx, &fdbs, client.MatchingFields{index: key}); err != nil {
		return fmt.Errorf("list FDBEntries of %s: %w", key, err)
	}
	label := lacev1.LabelEndpointUID
	if index == claimIndex {
		label = lacev1.LabelIPAMClaimUID
	}
	var stale []client.Object
	for _, o := range append(objects(nbrs.Items), objects(fdbs.Items)...) {
		if o.GetDeletionTimestamp() == nil && (keep == "" || o.GetLabels()[label] != string(keep)) {
			stale = append(stale, o)
		}
	}
	for _, o := range stale {
		// As read: one relabelled since (handed over) is not deleted.
		uid, rv := o.GetUID(), o.GetResourceVersion()
		if err := c.Delete(ctx, o, client.Preconditions{UID: &uid, ResourceVersion: &rv}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("release %T %s of %s: %w", o, o.GetName(), key, err)
		}
		log.FromContext(ctx).Info("released an l2 claim", "holder", key, "object", o.GetName())
	}
	return nil
}

// objects returns pointers to items as client.Objects.
func objects[T any, PT interface {
	*T
	client.Object
}](items []T) []client.Object {
	out := make([]client.Object, 0, len(items))
	for i := range items {
		out = append(out, PT(&items[i]))
	}
	return out
}
