package cni

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
)

// SyncEntries makes the pods' entries (endpoints, ports and their
// programs) follow the checkpoint: Ready endpoints are written and
// attached, Deleting ones and entries no endpoint claims removed. They
// survive restarts in the pinned maps; this also repairs them if the maps
// were lost. An ADD in progress (neither Ready nor Deleting) owns its
// entries: they are neither written nor removed here.
func (s *Server) SyncEntries() error {
	var errs []error
	var wantEps []datapath.Endpoint
	var wantPorts []datapath.Port
	busyEps := map[endpointKey]bool{}
	busyPorts := map[uint32]bool{}
	for _, e := range s.cp.all() {
		if e.Deleting {
			continue
		}
		if !e.Ready {
			for _, ad := range e.Addrs {
				busyEps[endpointKey{e.NetID, ad}] = true
			}
			busyPorts[uint32(e.HostIfIndex)] = true
			continue
		}
		pm, _ := net.ParseMAC(e.PodMAC)
		hm, _ := net.ParseMAC(e.HostMAC)
		// An l2 pod's entries too: from_pod delivers what is routed to it
		// (HostMAC is the gateway's, its host side's own MAC).
		p := datapath.Port{IfIndex: uint32(e.HostIfIndex), NetID: e.NetID, NetNSCookie: e.NetNSCookie, L2: e.L2, Learn: e.L2 && s.learn.learns(e.NetID)}
		for _, ad := range e.Addrs {
			wantEps = append(wantEps, datapath.Endpoint{NetID: e.NetID, Addr: ad, IfIndex: uint32(e.HostIfIndex), PodMAC: pm, HostMAC: hm})
			if ad.Is4() {
				p.V4 = ad
			} else {
				p.V6 = ad
			}
		}
		wantPorts = append(wantPorts, p)
	}
	// Synced against what was written (datapath's table reconciler): a
	// pod's ADD costs its own entries, not a read of every pod's.
	epsErr := s.dp.SyncEndpoints(wantEps, func(n uint32, ad netip.Addr) bool { return busyEps[endpointKey{n, ad}] })
	portsErr := s.dp.SyncPorts(wantPorts, func(i uint32) bool { return busyPorts[i] })
	errs = append(errs, epsErr, portsErr, s.dp.SyncL2Local(s.l2LocalEntries(s.cp.all())))
	// Programs: attached to every Ready endpoint's interface, detached from
	// the others (a DEL's, or a leftover no endpoint claims).
	pinned, err := s.dp.PinnedPodLinks()
	errs = append(errs, err)
	isPinned := map[string]bool{}
	for _, h := range pinned {
		isPinned[h] = true
	}
	claimed := map[string]bool{}
	s.mu.Lock()
	reattach := !s.podsReattached
	s.mu.Unlock()
	nErrs := len(errs)
	for _, e := range s.cp.all() {
		switch {
		case e.Ready:
			claimed[e.HostIf] = true
			if !isPinned[e.HostIf] || reattach {
				errs = append(errs, s.dp.AttachPod(s.opts.NetNS, e.HostIf, e.L2))
			}
		case !e.Deleting:
			claimed[e.HostIf] = true // an ADD in progress
		}
	}
	if reattach && errors.Join(errs[nErrs:]...) == nil {
		s.mu.Lock()
		s.podsReattached = true
		s.mu.Unlock()
	}
	detached := err == nil && portsErr == nil
	for _, h := range pinned {
		if !claimed[h] {
			if err := s.dp.DetachPod(h); err != nil {
				errs = append(errs, err)
				detached = false
			}
		}
	}
	// Last, once the deleted pods can make no new flow (else at the next
	// sync: the addresses stay noted).
	if detached {
		errs = append(errs, s.dp.ForgetRemovedFlows())
	}
	return errors.Join(errs...)
}

// endpointKey names a pod address in its network.
type endpointKey struct {
	net  uint32
	addr netip.Addr
}

// sameEndpoint compares endpoints, whose MACs are slices.
func sameEndpoint(a, b datapath.Endpoint) bool {
	return a.NetID == b.NetID && a.Addr == b.Addr && a.IfIndex == b.IfIndex &&
		bytes.Equal(a.PodMAC, b.PodMAC) && bytes.Equal(a.HostMAC, b.HostMAC)
}

// AdoptOnce runs adoptKernelEndpoints at the agent's first reconcile.
func (s *Server) AdoptOnce(ctx context.Context, st model.NodeState, nets []lacev1.Network) error {
	s.addLock.Lock()
	defer s.addLock.Unlock()
	if s.adopted {
		return nil
	}
	if err := s.adoptKernelEndpoints(ctx, st, nets); err != nil {
		return err
	}
	s.adopted = true
	return nil
}

// CollectEndpoints removes the endpoints of pods that no longer exist
// (deleted while the agent was down, or DEL never came), after confirming
// with the API server: a cold or lagging cache never removes a live pod.
func (s *Server) CollectEndpoints(ctx context.Context) error {
	for _, e := range s.cp.all() {
		if e.PodName == "" {
			// Adopted from the kernel, and no pod has its addresses.
			s.log.Info("removing endpoint no pod claims", "interface", e.HostIf, "addrs", e.Addrs)
			if err := s.teardown(ctx, e); err != nil {
				return err
			}
			continue
		}
		var pod corev1.Pod
		err := s.client.Get(ctx, types.NamespacedName{Namespace: e.PodNS, Name: e.PodName}, &pod)
		if err == nil && string(pod.UID) == e.PodUID {
			continue
		}
		err = s.reader.Get(ctx, types.NamespacedName{Namespace: e.PodNS, Name: e.PodName}, &pod)
		switch {
		case err == nil && string(pod.UID) == e.PodUID:
			continue
		case err != nil && !apierrors.IsNotFound(err):
			return fmt.Errorf("check pod %s/%s: %w", e.PodNS, e.PodName, err)
		}
		s.log.Info("removing endpoint of a pod that is gone", "pod", e.PodNS+"/"+e.PodName, "container", e.ContainerID)
		if err := s.teardown(ctx, e); err != nil {
			return err
		}
	}
	return nil
}

// teardown removes everything of one endpoint; what is gone already is fine.
func (s *Server) teardown(ctx context.Context, e Endpoint) error {
	// Recorded as Deleting, the applier removes its entries and program
	// (a port whose index another endpoint holds now stays: that one
	// claims it); then the interface goes, and the record last.
	e.Ready, e.Deleting = false, true
	if err := s.cp.put(e); err != nil {
		return err
	}
	var errs []error
	errs = append(errs, s.sync.SyncPods(ctx), s.node.TeardownPod(e.HostIf, e.Addrs))
	ne := &lacev1.NetworkEndpoint{}
	ne.Namespace, ne.Name = e.PodNS, e.PodName
	// An endpoint adopted without a pod has no record to remove.
	if e.PodName != "" {
		if err := s.client.Get(ctx, client.ObjectKeyFromObject(ne), ne); err == nil && ne.Labels[lacev1.LabelPodUID] == e.PodUID {
			if err := s.client.Delete(ctx, ne); client.IgnoreNotFound(err) != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tear down endpoint %s (container %q): %w", e.HostIf, e.ContainerID, err)
	}
	return s.cp.remove(e.HostIf)
}
