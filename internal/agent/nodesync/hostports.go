package nodesync

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/tables"
)

// hostPorts are the entries of this node's pods' hostPorts that svcs
// gives way to (model.HostPortEntries), and it reports what it refuses. A pod counts once
// its endpoint is Ready on this node: its addresses and network are the
// node's own records, not the pod's status.
func (s *Syncer) hostPorts(ctx context.Context, node *corev1.Node, addrs []netip.Addr, svcs []tables.Service,
	healthChecks []model.HealthCheck, slices []*discoveryv1.EndpointSlice) ([]tables.Service, error) {
	var pods corev1.PodList
	if err := s.client.List(ctx, &pods, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	type ep struct {
		net   uint32
		addrs []netip.Addr
	}
	var eps map[string]ep
	in := model.HostPortInput{NodeAddrs: addrs, MaxEntries: s.hostPort.max}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != s.opts.NodeName || p.Spec.HostNetwork || p.DeletionTimestamp != nil ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		var ports []corev1.ContainerPort
		for _, c := range p.Spec.Containers {
			ports = appendHostPorts(ports, c.Ports)
		}
		for _, c := range p.Spec.InitContainers {
			// Sidecars (restartable init containers) run beside the
			// others: the kubelet counts their hostPorts too.
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				ports = appendHostPorts(ports, c.Ports)
			}
		}
		if len(ports) == 0 {
			continue
		}
		if eps == nil {
			eps = map[string]ep{}
			s.pods.EachAttachment(func(uid string, netID uint32, addrs []netip.Addr) {
				eps[uid] = ep{netID, addrs}
			})
		}
		e, ok := eps[string(p.UID)]
		if !ok {
			continue
		}
		in.Pods = append(in.Pods, model.HostPortPod{Namespace: p.Namespace, Name: p.Name, UID: p.UID,
			Created: p.CreationTimestamp, NetID: e.net, Addrs: e.addrs, Ports: ports})
	}
	// What hostPorts may not take is read only when a pod asks for one:
	// the node's sockets and every EndpointSlice are not an endpoint
	// change's cost.
	if len(in.Pods) > 0 {
		listeners, err := nodeListeners("/proc/self/net")
		if err != nil {
			return nil, fmt.Errorf("the node's listening sockets: %w", err)
		}
		in.Reserved = append(s.reservedPorts(node, addrs, healthChecks, slices), listeners...)
	}
	entries, refused := model.HostPortEntries(in, svcs)
	s.reportHostPorts(refused)
	served := make([]uint16, len(entries))
	for i := range entries {
		served[i] = entries[i].Port
	}
	s.reserveLocalPorts(served)
	return entries, nil
}

// reserveLocalPorts keeps the served hostPorts and the SNAT range out of
// the node's ephemeral ports. A failure leaves the node's clients able to
// pick one (their answers would be taken) but serves the hostPorts: it is
// logged when it changes, not at every sync.
func (s *Syncer) reserveLocalPorts(ports []uint16) {
	err := s.hostPort.local.reserve(ports)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	s.hostPort.mu.Lock()
	defer s.hostPort.mu.Unlock()
	if msg != s.hostPort.localErr && err != nil {
		s.log.Warn("reserve the node's hostPorts and SNAT range from its ephemeral ports", "err", err)
	}
	s.hostPort.localErr = msg
}

func appendHostPorts(out, ports []corev1.ContainerPort) []corev1.ContainerPort {
	for _, p := range ports {
		if p.HostPort > 0 {
			out = append(out, p)
		}
	}
	return out
}

// reservedPorts are the node's own ports no hostPort may take: the
// kubelet's, the API server's where it runs on this node (the kubernetes
// Service's endpoints at the node's addresses), the agent's metrics and
// health ports and the health check node ports it serves.
func (s *Syncer) reservedPorts(node *corev1.Node, addrs []netip.Addr, hcs []model.HealthCheck,
	slices []*discoveryv1.EndpointSlice) []model.ReservedPort {
	out := []model.ReservedPort{{Proto: 6, Port: 10250, What: "kubelet"}}
	if node != nil {
		if p := node.Status.DaemonEndpoints.KubeletEndpoint.Port; p > 0 && p <= 65535 && p != 10250 {
			out = append(out, model.ReservedPort{Proto: 6, Port: uint16(p), What: "kubelet"})
		}
	}
	for _, s := range []struct{ addr, what string }{{s.opts.MetricsAddr, "lace-agent metrics"}, {s.opts.HealthAddr, "lace-agent health"}} {
		if _, p, err := net.SplitHostPort(s.addr); err == nil {
			if n, err := strconv.ParseUint(p, 10, 16); err == nil && n > 0 {
				out = append(out, model.ReservedPort{Proto: 6, Port: uint16(n), What: s.what})
			}
		}
	}
	for _, hc := range hcs {
		out = append(out, model.ReservedPort{Proto: 6, Port: hc.Port, What: "health check node port"})
	}
	for _, s := range slices {
		if s.Namespace != "default" || s.Labels[discoveryv1.LabelServiceName] != "kubernetes" {
			continue
		}
		for _, e := range s.Endpoints {
			for _, ip := range e.Addresses {
				at, err := netip.ParseAddr(ip)
				if err != nil || !containsAddr(addrs, at) {
					continue
				}
				for _, p := range s.Ports {
					if p.Port != nil && *p.Port > 0 && *p.Port <= 65535 {
						out = append(out, model.ReservedPort{Proto: 6, Port: uint16(*p.Port), Addr: at, What: "API server"})
					}
				}
			}
		}
	}
	return out
}

func containsAddr(addrs []netip.Addr, a netip.Addr) bool {
	for _, b := range addrs {
		if b == a {
			return true
		}
	}
	return false
}

// reportHostPorts logs each new refusal and makes a Warning Event of it
// on its pod (once per pod, reason and message: a refusal that lasts is
// not repeated at every sync).
func (s *Syncer) reportHostPorts(refused []model.HostPortRefusal) {
	s.hostPort.mu.Lock()
	defer s.hostPort.mu.Unlock()
	now := make(map[model.HostPortRefusal]bool, len(refused))
	for _, r := range refused {
		now[r] = true
		if s.hostPort.reported[r] {
			continue
		}
		s.log.Warn("hostPort refused", "pod", r.Namespace+"/"+r.Name, "reason", r.Reason, "message", r.Message)
		if s.recorder != nil {
			pod := &corev1.Pod{}
			pod.Namespace, pod.Name, pod.UID = r.Namespace, r.Name, r.UID
			s.recorder.Eventf(pod, corev1.EventTypeWarning, r.Reason, "node %s: %s", s.opts.NodeName, r.Message)
		}
	}
	s.hostPort.reported = now
}
