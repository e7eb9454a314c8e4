package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// External IPs are addresses a Service's author names (spec.externalIPs):
// nothing in the API checks that they are the author's to take, which is
// CVE-2020-8554 (a tenant names the API server's address, or a resolver's,
// and receives what was meant for it). Upstream leaves the remedy to
// admission (DenyServiceExternalIPs, an external webhook); Lace decides
// itself, the same way in the controller (which reports) and in every
// agent (which serves):
//
//   - an external IP is served only inside the operator's allow-list
//     (ServiceInput.AllowedExternalIPs, the chart's
//     services.externalIPs.allowedCIDRs; empty, the default, refuses
//     them all) and never on a reserved address (ServiceInput.Reserved:
//     node addresses, pod subnets, service ranges), even one allowed;
//   - an address two Services serve at one port goes to the ClusterIP,
//     then NodePort, load balancer address, external IP, and among
//     frontends of one kind to the oldest Service (creation time, then
//     UID): a newcomer can never take an address by its name's order;
//   - the node's own sockets are never translated to an external IP's
//     endpoints (bpf/sock.c): the node's processes (kubelet, the agent,
//     host-network pods) keep reaching the real address.

// Reasons of the Warning Events on a Service whose external IPs are
// refused (also the first word of lacev1.AnnotationExternalIPProblem).
const (
	ExternalIPReasonNotAllowed = "ExternalIPNotAllowed"
	ExternalIPReasonReserved   = "ExternalIPReserved"
	ExternalIPReasonInvalid    = "ExternalIPInvalid"
	ExternalIPReasonContested  = "ExternalIPContested"
)

// ExternalIPRefusal is an external IP of a Service that is not served, and
// why.
type ExternalIPRefusal struct {
	Addr   string // as the Service spells it
	Reason string // one of the ExternalIPReason constants
	// Detail says more: the reserved range, the Service that holds it.
	Detail string
}

func (r ExternalIPRefusal) String() string {
	if r.Detail == "" {
		return r.Addr + " (" + r.Reason + ")"
	}
	return r.Addr + " (" + r.Reason + ": " + r.Detail + ")"
}

// ParseAllowedExternalIPs reads the operator's allow-list (CIDRs, as the
// flags and the chart's values give them). A CIDR with host bits set
// (192.0.2.5/16) is refused, not silently widened to its network: the
// operator meant either the address or the range, and guessing the wider
// one would allow 65536 addresses for one. A /0 allows every address
// that is not reserved: warnings says so.
func ParseAllowedExternalIPs(cidrs []string) (out []netip.Prefix, warnings []string, err error) {
	for _, c := range cidrs {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			a, err2 := netip.ParseAddr(c)
			if err2 != nil {
				return nil, nil, fmt.Errorf("allowed external IPs: %q is neither a CIDR nor an address", c)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		if p != p.Masked() {
			return nil, nil, fmt.Errorf("allowed external IPs: %q has host bits set: write %s (the range) or %s/%d (the one address)",
				c, p.Masked(), p.Addr(), p.Addr().BitLen())
		}
		if p.Addr().Is4In6() {
			return nil, nil, fmt.Errorf("allowed external IPs: %q is an IPv4-mapped prefix: write the IPv4 one", c)
		}
		if p.Bits() == 0 {
			warnings = append(warnings, fmt.Sprintf("allowed external IPs: %s allows every address of its family (reserved ones excepted): any tenant may name any outside address", c))
		}
		out = append(out, p)
	}
	return out, warnings, nil
}

// admitExternalIP is the one verdict on an external IP address by itself
// (contests aside): "" when it may be served.
func admitExternalIP(a netip.Addr, reserved, allowed []netip.Prefix) (reason, detail string) {
	if i := slices.IndexFunc(reserved, func(p netip.Prefix) bool { return p.Contains(a) }); i >= 0 {
		return ExternalIPReasonReserved, "in " + reserved[i].String() + ", a node address, pod subnet or service range"
	}
	if !slices.ContainsFunc(allowed, func(p netip.Prefix) bool { return p.Contains(a) }) {
		if len(allowed) == 0 {
			return ExternalIPReasonNotAllowed, "the cluster allows no external IPs"
		}
		return ExternalIPReasonNotAllowed, "outside the cluster's allowed external IP ranges"
	}
	return "", ""
}

// externalIPs are the addresses of the service's external IPs that may be
// served, of the ClusterIP clusterIP's family (the refusals are recorded
// by refusedExternalIPs, once per service).
func (c *serviceCtx) externalIPs(clusterIP netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, s := range c.svc.Spec.ExternalIPs {
		a, ok := parseSloppyIP(s)
		if !ok || a.Is4() != clusterIP.Is4() {
			continue
		}
		if r, _ := admitExternalIP(a, c.env.reserved, c.env.allowedXIPs); r == "" {
			out = append(out, a)
		}
	}
	return out
}

// refusedExternalIPs lists the service's external IPs that are never
// served, whatever other Services hold: not addresses, of a family the
// service has no ClusterIP of, reserved, or outside the allow-list.
func (e *ServiceEnv) refusedExternalIPs(svc *corev1.Service, vips []netip.Addr) []ExternalIPRefusal {
	var out []ExternalIPRefusal
	for _, s := range svc.Spec.ExternalIPs {
		a, ok := parseSloppyIP(s)
		switch {
		case !ok:
			out = append(out, ExternalIPRefusal{Addr: s, Reason: ExternalIPReasonInvalid, Detail: "not an IP address"})
		case !slices.ContainsFunc(vips, func(v netip.Addr) bool { return v.Is4() == a.Is4() }):
			out = append(out, ExternalIPRefusal{Addr: s, Reason: ExternalIPReasonInvalid, Detail: "the Service has no ClusterIP of its family"})
		default:
			if r, d := admitExternalIP(a, e.reserved, e.allowedXIPs); r != "" {
				out = append(out, ExternalIPRefusal{Addr: s, Reason: r, Detail: d})
			}
		}
	}
	return out
}

// ServiceAge orders Services for the addresses they contest: the older
// (created first, then the lower UID) keeps it.
type ServiceAge struct {
	Created int64 // creationTimestamp, Unix seconds (the API's resolution)
	UID     types.UID
}

func ageOf(svc *corev1.Service) ServiceAge {
	return ServiceAge{Created: svc.CreationTimestamp.Unix(), UID: svc.UID}
}

// Compare is negative when a is older than b.
func (a ServiceAge) Compare(b ServiceAge) int {
	return cmp.Or(cmp.Compare(a.Created, b.Created), cmp.Compare(a.UID, b.UID))
}

// owners finds, by the address that names it in a table entry (its
// ClusterIP), the Service result an entry belongs to: ClusterIPs are
// unique, so the ClusterIP an external entry carries (or a ClusterIP
// entry's own VIP) says whose it is.
type owners map[netip.Addr]*ServiceResult

func newOwners(results []*ServiceResult) owners {
	o := owners{}
	for _, r := range results {
		for _, v := range r.VIPs {
			o[v] = r
		}
	}
	return o
}

func entryOwnerAddr(s *tables.Service) netip.Addr {
	if s.External() {
		return s.ClusterIP
	}
	return s.VIP
}

// wins tells whether entry a takes the (address, protocol, port) both
// claim from b: the lower frontend kind (ClusterIP, NodePort, load
// balancer, external IP), then the older Service. An entry whose Service
// is unknown never wins against a known one.
func (o owners) wins(a, b *tables.Service) bool {
	if a.Frontend != b.Frontend {
		return a.Frontend < b.Frontend
	}
	ra, rb := o[entryOwnerAddr(a)], o[entryOwnerAddr(b)]
	switch {
	case ra == rb || ra == nil:
		return false
	case rb == nil:
		return true
	}
	return ra.Age.Compare(rb.Age) < 0
}

// addrClaim is a Service's strongest claim on an address: the lowest
// frontend kind it has there.
type addrClaim struct {
	r    *ServiceResult
	kind tables.Frontend
}

// before tells whether claim a outranks b: the lower kind, the older
// Service, then (same age: a broken or hand-made object) namespace/name.
func (a addrClaim) before(b addrClaim) bool {
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	if c := a.r.Age.Compare(b.r.Age); c != 0 {
		return c < 0
	}
	return cmp.Or(cmp.Compare(a.r.Binding.Namespace, b.r.Binding.Namespace), cmp.Compare(a.r.Binding.Name, b.r.Binding.Name)) < 0
}

// externalOwners gives every address that some bound Service serves as an
// external IP its one owner, across ports and protocols: the Service with
// the strongest claim on it (any frontend there, or a load balancer
// status address, ipMode Proxy too). Only the owner's external IP entries
// on the address are served; a newer Service cannot add a port or a
// protocol to an address another holds. nil when no Service has an
// external IP entry (the common case costs one pass).
func externalOwners(results []*ServiceResult) map[netip.Addr]addrClaim {
	var own map[netip.Addr]addrClaim
	for _, r := range results {
		for i := range r.Services {
			if s := &r.Services[i]; s.Frontend == tables.FrontendExternalIP {
				if own == nil {
					own = map[netip.Addr]addrClaim{}
				}
				own[s.VIP] = addrClaim{}
			}
		}
	}
	if own == nil {
		return nil
	}
	claim := func(a netip.Addr, c addrClaim) {
		cur, ok := own[a]
		if ok && (cur.r == nil || c.before(cur)) {
			own[a] = c
		}
	}
	for _, r := range results {
		if r.Skipped {
			continue
		}
		for i := range r.Services {
			s := &r.Services[i]
			claim(s.VIP, addrClaim{r, s.Frontend})
		}
		for _, a := range r.LoadBalancerAddrs {
			claim(a, addrClaim{r, tables.FrontendLoadBalancer})
		}
	}
	return own
}

// ExternalIPInput is what the verdict on every Service's external IPs
// depends on: the binding (a Service that is not served claims nothing),
// the reserved addresses and the allow-list. EndpointSlices play no part.
type ExternalIPInput struct {
	Networks        []lacev1.Network
	BindingPolicies []lacev1.NetworkBindingPolicy
	Namespaces      map[string]map[string]string
	// Services: every Service that has external IPs or load balancer
	// addresses (the only frontends that can meet an external IP's
	// address; ClusterIPs and NodePorts are on reserved addresses).
	Services []corev1.Service
	Reserved []netip.Prefix
	Allowed  []netip.Prefix
}

// ExternalIPProblems is the controller's view of what the agents serve:
// for each Service (namespace/name) with refused external IPs, which and
// why. It runs the agents' own computation (Compute, MergeServices) and
// reads the contests from its result, so what it reports is what every
// node programs.
func ExternalIPProblems(in ExternalIPInput) map[ServiceKey][]ExternalIPRefusal {
	env := NewServiceEnv(ServiceInput{Networks: in.Networks, BindingPolicies: in.BindingPolicies,
		Namespaces: in.Namespaces, Reserved: in.Reserved, AllowedExternalIPs: in.Allowed})
	results := make([]ServiceResult, len(in.Services))
	ptrs := make([]*ServiceResult, len(in.Services))
	for i := range in.Services {
		results[i] = env.Compute(&in.Services[i], nil)
		ptrs[i] = &results[i]
	}
	merged := MergeServices(ptrs)
	type slot struct {
		vip   netip.Addr
		proto uint8
		port  uint16
	}
	served := make(map[slot]*tables.Service, len(merged.Services))
	for i := range merged.Services {
		s := &merged.Services[i]
		served[slot{s.VIP, s.Proto, s.Port}] = s
	}
	own := newOwners(ptrs)
	xown := externalOwners(ptrs)
	out := map[ServiceKey][]ExternalIPRefusal{}
	for i := range results {
		r := &results[i]
		svc := &in.Services[i]
		if r.Skipped {
			continue
		}
		refused := slices.Clone(r.RefusedExternalIPs)
		if r.Binding.Err != "" && len(svc.Spec.ExternalIPs) > 0 {
			// Not served at all (its binding error says why); what the
			// cluster would refuse anyway is said now.
			vips, _ := serviceVIPs(svc)
			refused = env.refusedExternalIPs(svc, vips)
		}
		lost := map[netip.Addr]string{}
		for j := range r.Services {
			s := &r.Services[j]
			if s.Frontend != tables.FrontendExternalIP {
				continue
			}
			if _, done := lost[s.VIP]; done {
				continue
			}
			// The address is another Service's (MergeServices drops
			// every external IP entry of this one on it).
			if o := xown[s.VIP]; o.r != nil && o.r != &results[i] {
				lost[s.VIP] = fmt.Sprintf("the address is held by Service %s/%s (%s)", o.r.Binding.Namespace, o.r.Binding.Name, o.kind)
				continue
			}
			w := served[slot{s.VIP, s.Proto, s.Port}]
			if w == nil || w.ClusterIP == s.ClusterIP && w.Frontend == s.Frontend {
				continue
			}
			holder := "another Service"
			if o := own[entryOwnerAddr(w)]; o != nil {
				holder = fmt.Sprintf("Service %s/%s (%s)", o.Binding.Namespace, o.Binding.Name, w.Frontend)
			}
			lost[s.VIP] = fmt.Sprintf("port %d/%s is held by %s", s.Port, protoName(s.Proto), holder)
		}
		for _, x := range svc.Spec.ExternalIPs {
			if a, ok := parseSloppyIP(x); ok && lost[a] != "" {
				refused = append(refused, ExternalIPRefusal{Addr: x, Reason: ExternalIPReasonContested, Detail: lost[a]})
				delete(lost, a)
			}
		}
		if len(refused) > 0 {
			out[ServiceKeyOf(svc.Namespace, svc.Name)] = refused
		}
	}
	return out
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	case 132:
		return "SCTP"
	}
	return fmt.Sprint(p)
}

// ExternalIPProblem is the one-line summary of refusals for the Service's
// annotation and Event: "Reason: addr (reason: detail), ..." with the
// first refusal's reason first ("" when none).
func ExternalIPProblem(refused []ExternalIPRefusal) string {
	if len(refused) == 0 {
		return ""
	}
	parts := make([]string, len(refused))
	for i, r := range refused {
		parts[i] = r.String()
	}
	return refused[0].Reason + ": external IPs not served: " + strings.Join(parts, ", ")
}
