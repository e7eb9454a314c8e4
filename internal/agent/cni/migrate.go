package cni

import (
	"context"
	"fmt"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
)

// Live migration on l2 networks: a second pod of a VM's IPAMClaim (the
// migration's target) gets the VM's addresses and MAC, and its port is
// the MAC's standby (lace-controller names its node in the MAC's
// FDBEntry). When the VM shows up there, the data plane moves the MAC to
// the port at once and reports it (Learned, Activated); the agent records
// the activation in the endpoint's spec.activated, and lace-controller
// moves the FDBEntry here with its sequence one higher, which every node
// then follows (the data plane's move holds until then). KubeVirt's word
// that the target is ready (AnnotationMigrationTargetReady on its pod)
// moves the MAC too, should the VM stay silent (activateReadyTargets).

// activated records the data plane's report that the MAC of the endpoint
// at port l.IfIndex showed up there. Off the ring reader's goroutine: an
// API write must not hold up the reports behind it.
func (s *Server) activated(l datapath.L2Learned) {
	var ep *Endpoint
	for _, e := range s.cp.all() {
		if e.Ready && !e.Deleting && e.L2 && uint32(e.HostIfIndex) == l.IfIndex && e.NetID == l.NetID && e.PodMAC == l.MAC.String() {
			ep = &e
			break
		}
	}
	if ep == nil {
		return
	}
	key := types.NamespacedName{Namespace: ep.PodNS, Name: ep.PodName}
	act := lacev1.L2Activation{MAC: lacev1.MACAddress(l.MAC.String()), Sequence: int64(l.Seq)}
	if !s.learn.firstActivation(key, act) {
		return
	}
	s.log.Info("a migrated VM showed up at its standby port", "endpoint", key.String(), "mac", act.MAC, "sequence", l.Seq)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.recordActivation(ctx, key, act); err != nil {
			s.log.Warn("record an l2 activation", "endpoint", key.String(), "error", err)
			s.learn.forgetActivation(key, act) // the next catch-up tries again
		}
	}()
}

// recordActivation writes act to the spec of endpoint key.
func (s *Server) recordActivation(ctx context.Context, key types.NamespacedName, act lacev1.L2Activation) error {
	return s.updateOwnEndpoint(ctx, key, func(spec *lacev1.NetworkEndpointSpec) bool {
		if a := spec.Activated; a != nil && *a == act {
			return false
		}
		spec.Activated = &act
		return true
	})
}

// firstActivation tells whether act of endpoint key is news: the ring's
// report and the catch-up (catchUpActivations) say it once.
func (l *learnState) firstActivation(key types.NamespacedName, act lacev1.L2Activation) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.activations == nil {
		l.activations = map[types.NamespacedName]lacev1.L2Activation{}
	}
	if l.activations[key] == act {
		return false
	}
	l.activations[key] = act
	return true
}

// forgetActivation forgets that act of endpoint key was recorded.
func (l *learnState) forgetActivation(key types.NamespacedName, act lacev1.L2Activation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.activations[key] == act {
		delete(l.activations, key)
	}
}

// catchUpActivations records the moves to standby ports here that no
// report said (a full ring, an agent restarted after the move), and
// forgets the endpoints whose move is over.
func (s *Server) catchUpActivations() {
	acts, err := s.dp.L2Activated()
	if err != nil {
		s.log.Warn("read the l2 moves", "error", err)
		return
	}
	live := map[types.NamespacedName]bool{}
	for _, l := range acts {
		s.activated(l)
		for _, e := range s.cp.all() {
			if uint32(e.HostIfIndex) == l.IfIndex {
				live[types.NamespacedName{Namespace: e.PodNS, Name: e.PodName}] = true
			}
		}
	}
	s.learn.mu.Lock()
	defer s.learn.mu.Unlock()
	for k := range s.learn.activations {
		if !live[k] {
			delete(s.learn.activations, k)
		}
	}
}

// activateReadyTargets moves to its port here the MAC of each l2 endpoint
// whose MAC stands by there (a live migration's target) and whose pod
// KubeVirt marked ready (AnnotationMigrationTargetReady), as the VM's
// first frame there would, and records the activation: a VM that stays
// silent after its migration (its announcement lost, nothing to send) is
// reached at the target all the same, at the control plane's pace. A pod
// is a target once: not after its VM ran there (spec.activated), nor when
// the pod holding the VM's claim was marked ready later than it (an older
// target, the next migration's source now: readyIsNewest). Cached reads
// only for a MAC that stands by here, API reads once per sequence.
func (s *Server) activateReadyTargets(ctx context.Context) {
	seen := map[types.NamespacedName]bool{}
	for _, e := range s.cp.all() {
		if !e.Ready || e.Deleting || !e.L2 {
			continue
		}
		mac, err := net.ParseMAC(e.PodMAC)
		if err != nil {
			continue
		}
		seq, standby, err := s.dp.L2Standby(e.NetID, mac, uint32(e.HostIfIndex))
		if err != nil {
			s.log.Warn("read an l2 standby", "mac", e.PodMAC, "error", err)
			continue
		}
		if !standby {
			continue
		}
		key := types.NamespacedName{Namespace: e.PodNS, Name: e.PodName}
		seen[key] = true
		// Read only, never kept: no copy of the cached objects.
		var ne lacev1.NetworkEndpoint
		if err := s.client.Get(ctx, key, &ne, client.UnsafeDisableDeepCopy); err != nil || ne.Spec.Activated != nil ||
			ne.Labels[lacev1.LabelPodUID] != e.PodUID {
			continue
		}
		var pod corev1.Pod
		if err := s.client.Get(ctx, key, &pod, client.UnsafeDisableDeepCopy); err != nil || string(pod.UID) != e.PodUID ||
			pod.Annotations[lacev1.AnnotationMigrationTargetReady] == "" {
			continue
		}
		if s.learn.judgedNotTarget(key, seq) {
			continue
		}
		newest, err := s.readyIsNewest(ctx, &pod)
		if err != nil {
			s.log.Warn("judge a migration's ready target", "endpoint", key.String(), "error", err)
			continue
		}
		if !newest {
			s.learn.notTarget(key, seq)
			s.log.Info("a pod marked ready as a migration's target before its VM's current pod stands by: not activated", "endpoint", key.String())
			continue
		}
		if err := s.dp.ActivateStandby(e.NetID, mac, seq); err != nil {
			s.log.Warn("activate a migration's ready target", "endpoint", key.String(), "error", err)
			continue
		}
		s.log.Info("a migration's target is ready: its VM's MAC moved to its port", "endpoint", key.String(), "mac", e.PodMAC, "sequence", seq)
		s.activated(datapath.L2Learned{IfIndex: uint32(e.HostIfIndex), NetID: e.NetID, MAC: mac, Activated: true, Seq: seq})
	}
	s.learn.forgetNotTargets(seen)
}

// readyIsNewest tells whether pod's target-ready mark is later than that
// of the pod holding its IPAMClaim (the VM's current pod, which has none
// when it was never a target), read from the API server.
func (s *Server) readyIsNewest(ctx context.Context, pod *corev1.Pod) (bool, error) {
	name := lacev1.IPAMClaimOf(pod.Annotations)
	mine := readyAt(pod)
	// A mark that is no time marks no target: compared as the zero time
	// it would still be later than an owner's mark in year 0.
	if name == "" || mine.IsZero() {
		return false, nil
	}
	var claim ipamclaimsv1.IPAMClaim
	if err := s.reader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, &claim); err != nil {
		return false, fmt.Errorf("get IPAMClaim %s/%s: %w", pod.Namespace, name, err)
	}
	o := claim.Status.OwnerPod
	if o == nil {
		return true, nil
	}
	if o.Name == pod.Name {
		return false, nil
	}
	var owner corev1.Pod
	if err := s.reader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: o.Name}, &owner); apierrors.IsNotFound(err) {
		return true, nil
	} else if err != nil {
		return false, fmt.Errorf("get the claim's owner %s/%s: %w", pod.Namespace, o.Name, err)
	}
	return mine.After(readyAt(&owner)), nil
}

// readyAt is when pod was marked ready as a migration's target (zero:
// never, or not a time).
func readyAt(pod *corev1.Pod) time.Time {
	t, _ := time.Parse(time.RFC3339, pod.Annotations[lacev1.AnnotationMigrationTargetReady])
	return t
}

// judgedNotTarget tells whether endpoint key was judged no target at
// sequence seq; notTarget records it; forgetNotTargets forgets the
// endpoints that stand by no more.
func (l *learnState) judgedNotTarget(key types.NamespacedName, seq uint32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.notTargets[key]
	return ok && s == seq
}

func (l *learnState) notTarget(key types.NamespacedName, seq uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.notTargets == nil {
		l.notTargets = map[types.NamespacedName]uint32{}
	}
	l.notTargets[key] = seq
}

func (l *learnState) forgetNotTargets(standing map[types.NamespacedName]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.notTargets {
		if !standing[k] {
			delete(l.notTargets, k)
		}
	}
}
