package controller

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
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

// Mobility of learned bindings (RFC 7432 section 15, FRR's and Junos'
// defaults): a MAC or address that moves maxMoves times within
// moveWindow is frozen where it is for moveWindow.
const (
	maxMoves   = 5
	moveWindow = 180 * time.Second
)

// maxLearnedPerNetwork bounds the learned addresses and MACs of one
// network: each is an entry in the maps every l2 network on a node shares.
const maxLearnedPerNetwork = 4096

// learnedIndex indexes NetworkEndpoints by the FDBEntry and Neighbor names
// of their learned bindings: an object freed wakes the endpoints that
// claimed it.
const learnedIndex = "lace.learned"

// Reasons of the learning Events and of condition Frozen.
const (
	ReasonLearnedTaken = "LearnedAddressTaken"
	ReasonLearnedLimit = "LearnedLimitReached"
	ReasonMACFlapping  = "MACFlapping"
	ReasonMACFrozen    = "MACFrozen"
	ReasonThawed       = "Thawed"
)

// L2LearnReconciler publishes what the ports of learning l2 networks
// learned: each binding of a NetworkEndpoint's spec.learned (written by
// its node's agent) becomes an FDBEntry for the MAC and a Neighbor for
// the address, learned: true, held for the endpoint like its assigned
// ones (released with it by L2AddressReconciler, whose indexes this one
// uses). A binding another endpoint learned moves here only with a higher
// sequence; an assigned address or MAC is never taken; a binding that
// moved maxMoves times within moveWindow is frozen (annotation, condition
// Frozen on the FDBEntry, Warning Events). Only the endpoint of its own
// pod on its pod's node is believed: an agent can write endpoints of any
// name for its node.
type L2LearnReconciler struct {
	Client    client.Client
	APIReader client.Reader
	Recorder  record.EventRecorder
	// Now is the clock (tests); time.Now when nil.
	Now func() time.Time
}

// SetupWithManager registers the reconciler (after L2AddressReconciler,
// which registers the holder indexes).
func (r *L2LearnReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &lacev1.NetworkEndpoint{}, learnedIndex, func(o client.Object) []string {
		ne := o.(*lacev1.NetworkEndpoint)
		var out []string
		for _, l := range ne.Spec.Learned {
			if mac, err := net.ParseMAC(string(l.MAC)); err == nil {
				out = append(out, ipam.FDBEntryName(ne.Spec.Network, mac))
			}
			if a, err := netip.ParseAddr(string(l.Address)); err == nil {
				out = append(out, ipam.NeighborName(ne.Spec.Network, a.Unmap()))
			}
		}
		return out
	}); err != nil {
		return fmt.Errorf("index NetworkEndpoints by learned bindings: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("l2learn").
		For(&lacev1.NetworkEndpoint{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// An update maps both the old and the new holder (the endpoint a
		// binding moved away from is told too), and every endpoint that
		// claims it: one freed is taken by the next claimant.
		Watches(&lacev1.Neighbor{}, handler.EnqueueRequestsFromMapFunc(r.claimants)).
		Watches(&lacev1.FDBEntry{}, handler.EnqueueRequestsFromMapFunc(r.claimants)).
		Watches(&lacev1.Network{}, handler.EnqueueRequestsFromMapFunc(r.endpointsOf), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
}

// claimants maps a Neighbor or FDBEntry to its holder endpoint and the
// endpoints whose learned bindings name it.
func (r *L2LearnReconciler) claimants(ctx context.Context, o client.Object) []reconcile.Request {
	var out []reconcile.Request
	if ns, name, ok := strings.Cut(o.GetAnnotations()[lacev1.AnnotationEndpoint], "/"); ok {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}})
	}
	var list lacev1.NetworkEndpointList
	if err := r.Client.List(ctx, &list, client.MatchingFields{learnedIndex: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "list the endpoints that learned an object", "object", o.GetName())
		return out
	}
	for _, ne := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&ne)})
	}
	return out
}

// endpointsOf maps a Network to its endpoints: learning turned off
// withdraws what they learned.
func (r *L2LearnReconciler) endpointsOf(ctx context.Context, o client.Object) []reconcile.Request {
	var list lacev1.NetworkEndpointList
	if err := r.Client.List(ctx, &list, client.MatchingLabels{lacev1.LabelNetwork: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "list the endpoints of a network", "network", o.GetName())
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, ne := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&ne)})
	}
	return out
}

func (r *L2LearnReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// learnedBinding is a valid binding of spec.learned.
type learnedBinding struct {
	mac  net.HardwareAddr
	addr netip.Addr // invalid: the MAC alone
	seq  int64
}

// Reconcile implements reconcile.Reconciler.
func (r *L2LearnReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var ne lacev1.NetworkEndpoint
	err := r.Client.Get(ctx, req.NamespacedName, &ne)
	if apierrors.IsNotFound(err) || (err == nil && ne.DeletionTimestamp != nil) {
		// What was held for it goes (L2AddressReconciler releases the
		// same, but does not watch learned objects: an orphan left while
		// the controller was down is swept from here).
		return reconcile.Result{}, release(ctx, r.Client, endpointIndex, req.String(), "")
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("get NetworkEndpoint %s: %w", req, err)
	}
	var nw lacev1.Network
	if err := r.Client.Get(ctx, client.ObjectKey{Name: ne.Spec.Network}, &nw); client.IgnoreNotFound(err) != nil {
		return reconcile.Result{}, fmt.Errorf("get Network %s: %w", ne.Spec.Network, err)
	}
	var want []learnedBinding
	if nw.Spec.Type == lacev1.NetworkTypeL2 && nw.Spec.L2 != nil && nw.Spec.L2.Learning && nw.Status.ID != 0 && nw.DeletionTimestamp == nil {
		trusted, err := r.trusted(ctx, &ne)
		if err != nil {
			return reconcile.Result{}, err
		}
		if trusted {
			want = validBindings(&ne, &nw)
		}
	}
	h := endpointHolder(&ne)
	var requeue time.Duration
	kept := map[string]bool{} // object names this endpoint holds for want
	for _, b := range want {
		name, claim, ok, after, err := r.learnMAC(ctx, h, &ne, b)
		if err != nil {
			return reconcile.Result{}, err
		}
		requeue = sooner(requeue, after)
		if !ok {
			continue
		}
		kept[name] = true
		if !b.addr.IsValid() {
			continue
		}
		name, ok, after, err = r.learnAddress(ctx, h, claim, &ne, b)
		if err != nil {
			return reconcile.Result{}, err
		}
		requeue = sooner(requeue, after)
		if ok {
			kept[name] = true
		}
	}
	after, err := r.withdraw(ctx, &ne, kept)
	if err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: sooner(requeue, after)}, nil
}

func sooner(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// trusted tells whether ne records its own pod on that pod's node, a pod
// bound to ne's network that lace-controller gave its addresses there
// (AddressesAllocated): a node's agent may write endpoints of any name and
// network for its node, and must not learn through them in a network its
// pods are not in.
func (r *L2LearnReconciler) trusted(ctx context.Context, ne *lacev1.NetworkEndpoint) (bool, error) {
	var pod corev1.Pod
	err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(ne), &pod)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get pod %s/%s: %w", ne.Namespace, ne.Name, err)
	}
	if ne.Labels[lacev1.LabelPodUID] != string(pod.UID) || pod.Spec.NodeName != ne.Spec.Node || pod.DeletionTimestamp != nil ||
		pod.Spec.HostNetwork || !meta.IsStatusConditionTrue(ne.Status.Conditions, lacev1.ConditionAddressesAllocated) || ne.Status.MAC == "" {
		return false, nil
	}
	why, err := notBound(ctx, r.Client, &pod, ne.Spec.Network)
	return why == nil && err == nil, err
}

// validBindings are the bindings of ne that may be learned in nw: a
// unicast MAC other than the gateway's, an address (if any) assignable in
// the network's subnet of its family; one per MAC and per address, the
// last written winning.
func validBindings(ne *lacev1.NetworkEndpoint, nw *lacev1.Network) []learnedBinding {
	seenMAC, seenAddr := map[string]bool{}, map[netip.Addr]bool{}
	var out []learnedBinding
	for i := len(ne.Spec.Learned) - 1; i >= 0; i-- {
		l := ne.Spec.Learned[i]
		mac, err := net.ParseMAC(string(l.MAC))
		// A MAC an endpoint may claim (not the gateway's, which the IPAM
		// derives too), or the endpoint's own.
		if err != nil || (mac.String() != string(ne.Status.MAC) && !ipam.L2Claimable(mac)) {
			continue
		}
		b := learnedBinding{mac: mac, seq: l.Sequence}
		if l.Address != "" {
			a, err := netip.ParseAddr(string(l.Address))
			if err != nil {
				continue
			}
			a = a.Unmap()
			p, ok := l2Prefix(nw, a.Is4())
			if !ok || !ipam.L2Assignable(p, a) || seenAddr[a] {
				continue
			}
			seenAddr[a] = true
			b.addr = a
		}
		if seenMAC[mac.String()] && !b.addr.IsValid() {
			continue
		}
		seenMAC[mac.String()] = true
		out = append(out, b)
	}
	slices.Reverse(out)
	return out
}

// learnMAC makes b's MAC this endpoint's (at its node): created when
// nobody holds it, taken from another endpoint that learned it with a
// lower sequence unless frozen; refused when assigned to another. It
// returns the FDBEntry's name, the IPAMClaim UID holding it when it is the
// endpoint's own MAC kept by its claim, whether this endpoint holds it, and
// when to look again (a freeze ending).
func (r *L2LearnReconciler) learnMAC(ctx context.Context, h holder, ne *lacev1.NetworkEndpoint, b learnedBinding) (string, string, bool, time.Duration, error) {
	network := ne.Spec.Network
	name := ipam.FDBEntryName(network, b.mac)
	var cur lacev1.FDBEntry
	err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &cur)
	if apierrors.IsNotFound(err) {
		if full, err := r.full(ctx, ne, &lacev1.FDBEntryList{}, "MAC "+b.mac.String()); err != nil || full {
			return "", "", false, 0, err
		}
		f := h.fdbEntry(network, b.mac, ne.Spec.Node)
		f.Spec.Learned, f.Spec.Sequence, f.Spec.Publisher = true, b.seq, ne.Spec.Node
		if err := r.Client.Create(ctx, f); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", "", false, 0, fmt.Errorf("publish learned MAC %s of network %s: %w", b.mac, network, err)
		} else if err != nil {
			return "", "", false, time.Second, nil // taken meanwhile: judged again
		}
		log.FromContext(ctx).Info("learned an l2 MAC", "endpoint", h.key, "network", network, "mac", b.mac, "node", ne.Spec.Node)
		return name, "", true, 0, nil
	}
	if err != nil {
		return "", "", false, 0, fmt.Errorf("get FDBEntry %s: %w", name, err)
	}
	thawAfter, err := r.thaw(ctx, &cur)
	if err != nil {
		return "", "", false, 0, err
	}
	if cur.Labels[h.label] == string(h.uid) {
		return name, "", true, thawAfter, nil
	}
	// The endpoint's own MAC, kept by its IPAMClaim (a VM's): its
	// addresses may be learned on it too (status is lace-controller's).
	if claim := cur.Labels[lacev1.LabelIPAMClaimUID]; !cur.Spec.Learned && claim != "" && string(ne.Status.MAC) == b.mac.String() {
		return name, claim, true, 0, nil
	}
	if !cur.Spec.Learned {
		r.Recorder.Eventf(ne, corev1.EventTypeWarning, ReasonLearnedTaken, "MAC %s sent on this port is assigned to %s in network %s: not learned", b.mac, holderName(&cur), network)
		return "", "", false, 0, nil
	}
	if b.seq <= cur.Spec.Sequence {
		return "", "", false, 0, nil // the holder's claim is newer
	}
	if thawAfter > 0 {
		r.Recorder.Eventf(ne, corev1.EventTypeWarning, ReasonMACFrozen, "MAC %s of network %s is frozen at node %s until %s: not moved here",
			b.mac, network, cur.Spec.Node, cur.Annotations[lacev1.AnnotationFrozenUntil])
		return "", "", false, thawAfter, nil
	}
	next := cur.DeepCopy()
	next.Spec.Node, next.Spec.Sequence, next.Spec.Publisher = ne.Spec.Node, b.seq, ne.Spec.Node
	froze := r.moved(next, h)
	if err := r.Client.Patch(ctx, next, client.MergeFromWithOptions(&cur, client.MergeFromWithOptimisticLock{})); err != nil {
		return "", "", false, 0, fmt.Errorf("move learned MAC %s of network %s to %s: %w", b.mac, network, h.key, err)
	}
	log.FromContext(ctx).Info("moved a learned l2 MAC", "mac", b.mac, "network", network, "from", cur.Spec.Node, "to", ne.Spec.Node, "sequence", b.seq)
	if !froze {
		return name, "", true, 0, nil
	}
	msg := fmt.Sprintf("MAC %s of network %s moved %d times within %s (now to node %s, endpoint %s): frozen there until %s; a duplicate MAC or a loop",
		b.mac, network, maxMoves, moveWindow, ne.Spec.Node, h.key, next.Annotations[lacev1.AnnotationFrozenUntil])
	r.Recorder.Event(next, corev1.EventTypeWarning, ReasonMACFlapping, msg)
	r.Recorder.Event(ne, corev1.EventTypeWarning, ReasonMACFlapping, msg)
	return name, "", true, moveWindow, r.setFrozen(ctx, next, metav1.ConditionTrue, ReasonMACFlapping, msg)
}

// full tells whether ne's network holds maxLearnedPerNetwork learned
// objects of list's kind already (a Warning Event then, naming what, the
// one refused).
func (r *L2LearnReconciler) full(ctx context.Context, ne *lacev1.NetworkEndpoint, list client.ObjectList, what string) (bool, error) {
	if err := r.Client.List(ctx, list, client.MatchingLabels{lacev1.LabelNetwork: ne.Spec.Network}); err != nil {
		return false, fmt.Errorf("list the learned objects of network %s: %w", ne.Spec.Network, err)
	}
	n := 0
	_ = meta.EachListItem(list, func(o runtime.Object) error {
		if isLearned(o) {
			n++
		}
		return nil
	})
	if n < maxLearnedPerNetwork {
		return false, nil
	}
	r.Recorder.Eventf(ne, corev1.EventTypeWarning, ReasonLearnedLimit, "network %s holds %d learned objects of this kind already: %s not learned", ne.Spec.Network, n, what)
	return true, nil
}

// learnAddress makes b's address this endpoint's, bound to b's MAC (which
// it holds): created when nobody holds it, taken over from another
// endpoint that learned it (with the MAC that moved here, or with a lower
// sequence unless frozen); refused when assigned.
func (r *L2LearnReconciler) learnAddress(ctx context.Context, h holder, claim string, ne *lacev1.NetworkEndpoint, b learnedBinding) (string, bool, time.Duration, error) {
	network := ne.Spec.Network
	name := ipam.NeighborName(network, b.addr)
	var cur lacev1.Neighbor
	err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &cur)
	if apierrors.IsNotFound(err) {
		if full, err := r.full(ctx, ne, &lacev1.NeighborList{}, "address "+b.addr.String()); err != nil || full {
			return "", false, 0, err
		}
		n := h.neighbor(network, b.addr, b.mac)
		n.Spec.Learned, n.Spec.Sequence, n.Spec.Publisher = true, b.seq, ne.Spec.Node
		if claim != "" {
			// Joined with the MAC its claim holds (model's sameHolder);
			// released with the endpoint.
			n.Labels[lacev1.LabelIPAMClaimUID] = claim
		}
		if err := r.Client.Create(ctx, n); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", false, 0, fmt.Errorf("publish learned address %s of network %s: %w", b.addr, network, err)
		} else if err != nil {
			return "", false, time.Second, nil
		}
		log.FromContext(ctx).Info("learned an l2 address", "endpoint", h.key, "network", network, "address", b.addr, "mac", b.mac)
		return name, true, 0, nil
	}
	if err != nil {
		return "", false, 0, fmt.Errorf("get Neighbor %s: %w", name, err)
	}
	if !cur.Spec.Learned {
		r.Recorder.Eventf(ne, corev1.EventTypeWarning, ReasonLearnedTaken, "address %s sent on this port is assigned to %s in network %s: not learned", b.addr, holderName(&cur), network)
		return "", false, 0, nil
	}
	sameMAC := strings.EqualFold(string(cur.Spec.MAC), b.mac.String())
	mine := cur.Labels[h.label] == string(h.uid)
	if mine && sameMAC {
		return name, true, 0, nil
	}
	frozenFor := frozenFor(&cur, r.now())
	// Following its MAC here is no move of the address.
	if !mine && !sameMAC && b.seq <= cur.Spec.Sequence {
		return "", false, 0, nil
	}
	if !sameMAC && frozenFor > 0 {
		return "", false, frozenFor, nil
	}
	next := cur.DeepCopy()
	if next.Labels == nil {
		next.Labels = map[string]string{}
	}
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	next.Labels[h.label], next.Annotations[h.annotation] = string(h.uid), h.key
	next.Spec.MAC, next.Spec.Publisher = lacev1.MACAddress(b.mac.String()), ne.Spec.Node
	next.Spec.Sequence = max(cur.Spec.Sequence, b.seq)
	froze := !sameMAC && r.moved(next, h)
	if err := r.Client.Patch(ctx, next, client.MergeFromWithOptions(&cur, client.MergeFromWithOptimisticLock{})); err != nil {
		return "", false, 0, fmt.Errorf("move learned address %s of network %s to %s: %w", b.addr, network, h.key, err)
	}
	if froze {
		msg := fmt.Sprintf("address %s of network %s changed MAC %d times within %s (now %s, endpoint %s): frozen until %s",
			b.addr, network, maxMoves, moveWindow, b.mac, h.key, next.Annotations[lacev1.AnnotationFrozenUntil])
		r.Recorder.Event(next, corev1.EventTypeWarning, ReasonMACFlapping, msg)
		r.Recorder.Event(ne, corev1.EventTypeWarning, ReasonMACFlapping, msg)
		return name, true, moveWindow, nil
	}
	return name, true, 0, nil
}

// moved relabels o to h and records a move at now; it tells whether that
// move froze o (its maxMoves-th within moveWindow).
func (r *L2LearnReconciler) moved(o client.Object, h holder) bool {
	now := r.now()
	labels, ann := o.GetLabels(), o.GetAnnotations()
	if labels == nil {
		labels = map[string]string{}
	}
	if ann == nil {
		ann = map[string]string{}
	}
	labels[h.label], ann[h.annotation] = string(h.uid), h.key
	var moves []string
	for _, s := range strings.Split(ann[lacev1.AnnotationMoves], ",") {
		if ms, err := strconv.ParseInt(s, 10, 64); err == nil && now.Sub(time.UnixMilli(ms)) < moveWindow {
			moves = append(moves, s)
		}
	}
	moves = append(moves, strconv.FormatInt(now.UnixMilli(), 10))
	froze := len(moves) >= maxMoves
	if froze {
		ann[lacev1.AnnotationFrozenUntil] = now.Add(moveWindow).UTC().Format(time.RFC3339)
		moves = nil
	}
	if len(moves) > maxMoves {
		moves = moves[len(moves)-maxMoves:]
	}
	ann[lacev1.AnnotationMoves] = strings.Join(moves, ",")
	o.SetLabels(labels)
	o.SetAnnotations(ann)
	return froze
}

// frozenFor is how long o stays frozen (0: it may move).
func frozenFor(o client.Object, now time.Time) time.Duration {
	until, err := time.Parse(time.RFC3339, o.GetAnnotations()[lacev1.AnnotationFrozenUntil])
	if err != nil || !until.After(now) {
		return 0
	}
	return until.Sub(now)
}

// thaw ends f's freeze once it is over (condition Frozen False), and
// reports a freeze whose condition a failed write left out; it returns
// how long f stays frozen.
func (r *L2LearnReconciler) thaw(ctx context.Context, f *lacev1.FDBEntry) (time.Duration, error) {
	c := meta.FindStatusCondition(f.Status.Conditions, lacev1.ConditionFrozen)
	if d := frozenFor(f, r.now()); d > 0 {
		if c == nil || c.Status != metav1.ConditionTrue {
			msg := fmt.Sprintf("MAC %s of network %s moved %d times within %s: frozen at node %s until %s",
				f.Spec.MAC, f.Spec.Network, maxMoves, moveWindow, f.Spec.Node, f.Annotations[lacev1.AnnotationFrozenUntil])
			return d, r.setFrozen(ctx, f, metav1.ConditionTrue, ReasonMACFlapping, msg)
		}
		return d, nil
	}
	if c == nil || c.Status != metav1.ConditionTrue {
		return 0, nil
	}
	return 0, r.setFrozen(ctx, f, metav1.ConditionFalse, ReasonThawed, "the freeze is over: the MAC may move again")
}

// setFrozen writes condition Frozen on f's status.
func (r *L2LearnReconciler) setFrozen(ctx context.Context, f *lacev1.FDBEntry, status metav1.ConditionStatus, reason, msg string) error {
	next := f.DeepCopy()
	meta.SetStatusCondition(&next.Status.Conditions, metav1.Condition{Type: lacev1.ConditionFrozen, Status: status, Reason: reason, Message: msg})
	if err := r.Client.Status().Patch(ctx, next, client.MergeFrom(f)); err != nil {
		return fmt.Errorf("report FDBEntry %s frozen=%s: %w", f.Name, status, err)
	}
	*f = *next
	return nil
}

// withdraw deletes the learned objects held for ne that it no longer
// learns (not in kept): a binding its agent dropped, or its network's
// learning turned off.
func (r *L2LearnReconciler) withdraw(ctx context.Context, ne *lacev1.NetworkEndpoint, kept map[string]bool) (time.Duration, error) {
	key := ne.Namespace + "/" + ne.Name
	var nbrs lacev1.NeighborList
	if err := r.Client.List(ctx, &nbrs, client.MatchingFields{endpointIndex: key}); err != nil {
		return 0, fmt.Errorf("list Neighbors of %s: %w", key, err)
	}
	var fdbs lacev1.FDBEntryList
	if err := r.Client.List(ctx, &fdbs, client.MatchingFields{endpointIndex: key}); err != nil {
		return 0, fmt.Errorf("list FDBEntries of %s: %w", key, err)
	}
	var doomed []client.Object
	var requeue time.Duration
	for i := range nbrs.Items {
		n := &nbrs.Items[i]
		if !n.Spec.Learned || kept[n.Name] || n.Labels[lacev1.LabelEndpointUID] != string(ne.UID) {
			continue
		}
		// Frozen, as a MAC (below): its moves are not forgotten.
		if d := frozenFor(n, r.now()); d > 0 {
			requeue = sooner(requeue, d)
			continue
		}
		doomed = append(doomed, n)
	}
	for i := range fdbs.Items {
		f := &fdbs.Items[i]
		if !f.Spec.Learned || kept[f.Name] || f.Labels[lacev1.LabelEndpointUID] != string(ne.UID) {
			continue
		}
		// A frozen MAC stays where it is, held, until the freeze ends:
		// deleting it would let the next sender take it at once.
		if d := frozenFor(f, r.now()); d > 0 {
			requeue = sooner(requeue, d)
			continue
		}
		doomed = append(doomed, f)
	}
	for _, o := range doomed {
		if err := deleteAsRead(ctx, r.Client, o); err != nil {
			return 0, fmt.Errorf("withdraw learned %T %s of %s: %w", o, o.GetName(), key, err)
		}
		log.FromContext(ctx).Info("withdrew a learned l2 binding", "endpoint", key, "object", o.GetName())
	}
	return requeue, nil
}
