package chaos

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// serviceDump says, when a run fails, how the workload's Service stands:
// its EndpointSlices' endpoints, and what each node's maps balance its
// ClusterIP over, each address with the pod that holds it now. A failure
// through the Service on a loaded CI machine leaves nothing else behind
// (the lab goes down with its logs), and a backend that no pod of the
// Service holds is told apart here from a Service without backends.
func (h *harness) serviceDump(ctx context.Context) []string {
	var out []string
	holder := map[netip.Addr]string{}
	pods, err := h.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return []string{"pods: " + err.Error()}
	}
	for _, p := range pods.Items {
		if !holdsAddrs(&p) {
			continue // its address may be another's
		}
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				holder[a] = fmt.Sprintf("%s/%s on %s", p.Namespace, p.Name, p.Spec.NodeName)
			}
		}
	}
	who := func(a netip.Addr) string {
		if p, ok := holder[a]; ok {
			return p
		}
		return "no pod"
	}
	eps, err := h.cs.DiscoveryV1().EndpointSlices(Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + svcName})
	if err != nil {
		return append(out, "endpoint slices: "+err.Error())
	}
	for _, sl := range eps.Items {
		for _, ep := range sl.Endpoints {
			var ref, node string
			if ep.TargetRef != nil {
				ref = ep.TargetRef.Name
			}
			if ep.NodeName != nil {
				node = *ep.NodeName
			}
			c := ep.Conditions
			for _, s := range ep.Addresses {
				a, _ := netip.ParseAddr(s)
				out = append(out, fmt.Sprintf("slice %s: %s of %s on %s (ready %v, serving %v, terminating %v), held by %s",
					sl.Name, s, ref, node, deref(c.Ready), deref(c.Serving), deref(c.Terminating), who(a)))
			}
		}
	}
	web, err := h.cs.CoreV1().Services(Namespace).Get(ctx, svcName, metav1.GetOptions{})
	if err != nil {
		return append(out, "service: "+err.Error())
	}
	for i := 1; i <= h.cfg.Nodes; i++ {
		node := h.cfg.NodeName(i)
		got, err := readNodeMaps(h.cfg.PinDir(node))
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", node, err))
			continue
		}
		for _, vip := range addrsOf(web.Spec.ClusterIPs) {
			for _, sp := range web.Spec.Ports {
				k := frontKey{vip, protoNum(sp.Protocol), uint16(sp.Port)}
				bs, ok := got.fronts[k]
				if !ok {
					out = append(out, fmt.Sprintf("%s: %s not served", node, k))
					continue
				}
				var held []string
				for _, b := range bs {
					ap, err := netip.ParseAddrPort(b)
					if err != nil {
						held = append(held, b)
						continue
					}
					held = append(held, b+" ("+who(ap.Addr())+")")
				}
				out = append(out, fmt.Sprintf("%s: %s balances over [%s]", node, k, strings.Join(held, ", ")))
			}
		}
	}
	return out
}

func deref(b *bool) string {
	if b == nil {
		return "unset"
	}
	return fmt.Sprint(*b)
}
