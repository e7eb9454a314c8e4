package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	netutils "k8s.io/utils/net"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// Service-related labels and annotations.
const (
	// LabelServiceProxyName hands a Service to another proxy: kube-proxy
	// watches only Services and EndpointSlices without it (its informers'
	// label selector), and so does Lace, whatever its value.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// TrafficDistributionPreferClosest is the one value of Lace's own
	// distribution preference, lacev1.AnnotationTrafficDistribution.
	TrafficDistributionPreferClosest = "PreferClosest"
)

// ServiceInput is everything a node's service tables depend on.
type ServiceInput struct {
	Node, Zone       string // this node and its zone (topology.kubernetes.io/zone)
	Networks         []lacev1.Network
	BindingPolicies  []lacev1.NetworkBindingPolicy
	Services         []corev1.Service
	EndpointSlices   []discoveryv1.EndpointSlice
	NetworkEndpoints []lacev1.NetworkEndpoint // which network each pod address belongs to
	// PodIndex, when set, is used instead of indexing NetworkEndpoints:
	// a caller that keeps the index up to date between computations
	// (the agent) is spared indexing every pod of the cluster again.
	PodIndex   *PodAddrIndex
	Namespaces map[string]map[string]string // namespace -> labels (for binding namespaceSelectors)
	// NodeAddrs are this node's primary underlay addresses (one per
	// family): where its NodePorts are served.
	NodeAddrs []netip.Addr
	// Reserved are addresses no Service's externalIPs may claim: every
	// node's, the pod networks' subnets and the service ranges (an
	// external IP there would take over traffic that is somebody else's,
	// CVE-2020-8554's man in the middle). ReservedFor builds them.
	Reserved []netip.Prefix
	// AllowedExternalIPs are the only addresses externalIPs may name (the
	// operator's allow-list; empty refuses every external IP), reserved
	// ones excepted (externalips.go).
	AllowedExternalIPs []netip.Prefix
	// HostEndpoints gates endpoints at node addresses and at the API
	// server's (hostendpoints.go); the zero value gates nothing.
	HostEndpoints HostEndpoints
}

// ReservedFor lists the addresses externalIPs may not claim: every
// node's underlay addresses, the subnets of pod networks and the service
// ranges (ReservedHosts adds every Node's and the API server's).
func ReservedFor(ueps []lacev1.UnderlayEndpoint, nets []lacev1.Network, serviceCIDRs []netip.Prefix) []netip.Prefix {
	out := slices.Clone(serviceCIDRs)
	for _, u := range ueps {
		for _, s := range u.Spec.Addresses {
			if a, err := netip.ParseAddr(string(s)); err == nil {
				out = append(out, netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	for _, n := range nets {
		if n.Spec.Type == lacev1.NetworkTypeExternal {
			continue
		}
		for _, sub := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if sub == nil {
				continue
			}
			if p, err := netip.ParsePrefix(string(sub.Prefix)); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	return out
}

// ReservedHosts are the addresses of every Node (status.addresses: the
// underlay, other NICs, a cloud's ExternalIP) and of the API server (the
// endpoints of the default/kubernetes Service's slices), one prefix each,
// sorted: Reserved too, beside ReservedFor's. An external IP or a load
// balancer address there would divert the kubelet's or the API server's
// traffic.
func ReservedHosts(nodes []corev1.Node, epSlices []*discoveryv1.EndpointSlice) []netip.Prefix {
	var out []netip.Prefix
	add := func(s string) {
		if a, ok := parseSloppyIP(s); ok {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	for i := range nodes {
		for _, na := range nodes[i].Status.Addresses {
			add(na.Address)
		}
	}
	for _, sl := range epSlices {
		if sl.Namespace != metav1.NamespaceDefault || sl.Labels[discoveryv1.LabelServiceName] != "kubernetes" {
			continue
		}
		for _, ep := range sl.Endpoints {
			for _, a := range ep.Addresses {
				add(a)
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return slices.Compact(out)
}

// ServiceState is what the node serves and what it left out, with why.
type ServiceState struct {
	// Services is sorted by (VIP, Proto, Port); each one's backends by
	// (Addr, Port).
	Services []tables.Service
	// Bound has every service considered (not skipped), sorted by
	// namespace and name, with its network or the reason it has none.
	Bound []ServiceBinding
	// Excluded lists the endpoints left out because their pod is in
	// another network, the host endpoint gate refuses them, or their
	// address is another pod's now, once per (service, address), sorted.
	Excluded []ExcludedEndpoint
	// HealthChecks are the healthCheckNodePorts this node answers
	// (LoadBalancer services with externalTrafficPolicy Local), sorted by
	// port.
	HealthChecks []HealthCheck
	// Changes says which frontends of Services may differ from the
	// merges before (the agent's cache; the zero value: not known).
	Changes ServiceChanges
}

// HealthCheck is a service's healthCheckNodePort and the number of its
// ready endpoints on this node (terminating ones are not ready), which
// kube-proxy reports: 200 with the count, 503 when it is 0.
type HealthCheck struct {
	Namespace, Name string
	Port            uint16
	LocalEndpoints  int
}

// ServiceBinding is the network a service is bound to, or Err saying why it
// has none (then it is not served).
type ServiceBinding struct {
	Namespace, Name, Network, Policy string
	NetID                            uint32
	Err                              string
}

// ExcludedEndpoint is an endpoint address of a service left out: one
// that belongs to a pod of Network, not of the service's network
// ServiceNetwork (Network names every other network holding the address,
// comma-separated, when it is known only by address), or one refused
// (Refused says why: HostEndpoints.Refused, or another pod holds its
// address now, reusedBy).
type ExcludedEndpoint struct {
	Namespace, Service string
	Addr               netip.Addr
	Network            string
	ServiceNetwork     string
	Refused            string
}

// ComputeServices decides which service ports this node serves, in which
// network, with which backends.
//
// It is NewServiceEnv, Compute for each service with its slices
// (SlicesByService) and MergeServices; a caller that keeps each service's
// result between calls (the agent) recomputes only the services whose
// objects changed and gets the same state.
func ComputeServices(in ServiceInput) ServiceState {
	env := NewServiceEnv(in)
	bySvc := SlicesByService(in.EndpointSlices)
	results := make([]ServiceResult, len(in.Services))
	ptrs := make([]*ServiceResult, len(in.Services))
	for i := range in.Services {
		svc := &in.Services[i]
		results[i] = env.Compute(svc, bySvc[ServiceKeyOf(svc.Namespace, svc.Name)])
		ptrs[i] = &results[i]
	}
	return MergeServices(ptrs)
}

// ServiceEnv is what the computation of every service shares: this node
// and its zone, the networks' IDs, the binding policies (sorted, their
// selectors parsed once), the namespaces' labels and which network holds
// each pod address. It is read-only once made, but for the pod index
// (ServiceInput.PodIndex) and the namespaces' labels, which a caller that
// keeps them between computations (the agent) updates between them.
type ServiceEnv struct {
	node, zone string
	ids        map[string]uint32
	exists     map[string]bool
	binder     binder
	namespaces map[string]map[string]string
	pods       *PodAddrIndex
	nodeAddrs  []netip.Addr
	reserved   []netip.Prefix
	// allowedXIPs is the operator's allow-list of external IPs.
	allowedXIPs []netip.Prefix
	hostEPs     HostEndpoints
}

// NewServiceEnv prepares the shared part of in (everything but Services
// and EndpointSlices).
func NewServiceEnv(in ServiceInput) *ServiceEnv {
	e := &ServiceEnv{node: in.Node, zone: in.Zone, ids: NetworkIDs(in.Networks), exists: map[string]bool{},
		binder: newBinder(in.BindingPolicies, lacev1.MatchKindService), namespaces: in.Namespaces,
		pods: in.PodIndex, nodeAddrs: in.NodeAddrs, reserved: in.Reserved,
		allowedXIPs: in.AllowedExternalIPs, hostEPs: in.HostEndpoints}
	if e.pods == nil {
		e.pods = NewPodAddrIndex()
		for i := range in.NetworkEndpoints {
			e.pods.Add(&in.NetworkEndpoints[i])
		}
	}
	for _, n := range in.Networks {
		e.exists[n.Name] = true
	}
	return e
}

// ServiceKey names a service.
type ServiceKey struct{ Namespace, Name string }

// ServiceKeyOf is the key of the service name in namespace ns.
func ServiceKeyOf(ns, name string) ServiceKey { return ServiceKey{ns, name} }

// ServiceResult is one service's part of a ServiceState.
type ServiceResult struct {
	// Skipped: Lace leaves the service alone (headless, ExternalName,
	// another proxy's); the rest is empty.
	Skipped bool
	Binding ServiceBinding
	// VIPs are the service's ClusterIPs as the views see them (those of
	// BoundServiceVIPs), set only when it is bound.
	VIPs        []netip.Addr
	Services    []tables.Service
	Excluded    []ExcludedEndpoint
	HealthCheck *HealthCheck
	// Age ranks the service's frontends against other Services' at one
	// address (MergeServices).
	Age ServiceAge
	// RefusedExternalIPs are its external IPs never served whatever
	// others hold (not allowed, reserved, invalid), set when it is bound.
	RefusedExternalIPs []ExternalIPRefusal
	// LoadBalancerAddrs are the addresses of its load balancer status
	// (ipMode Proxy ones too, which have no entries): they claim the
	// address against other Services' external IPs on any port.
	LoadBalancerAddrs []netip.Addr
	// PodAddrs are the addresses the result looked up in the
	// PodAddrIndex, sorted: it stays true while no NetworkEndpoint
	// holding one of them comes, changes or goes.
	PodAddrs []netip.Addr
}

// Compute is the result of one service, with the EndpointSlices that
// belong to it (SlicesByService; any order).
func (e *ServiceEnv) Compute(svc *corev1.Service, svcSlices []*discoveryv1.EndpointSlice) ServiceResult {
	vips, ok := serviceVIPs(svc)
	if !ok {
		return ServiceResult{Skipped: true}
	}
	r := ServiceResult{Binding: ServiceBinding{Namespace: svc.Namespace, Name: svc.Name}}
	b := &r.Binding
	bind, err := e.binder.bind(svc.Namespace, svc.Name, svc.Labels, e.namespaces[svc.Namespace])
	if err != nil {
		b.Err = err.Error()
		return r
	}
	b.Network, b.Policy = bind.Network, bind.Policy
	id, ok := e.ids[bind.Network]
	if !ok {
		if e.exists[bind.Network] {
			b.Err = fmt.Sprintf("network %s has no ID yet", bind.Network)
		} else {
			b.Err = fmt.Sprintf("network %s does not exist", bind.Network)
		}
		return r
	}
	b.NetID = id
	// The addresses the entries carry, parsed once: the owners
	// (MergeServices) and the views must see the same ones.
	r.VIPs = vips
	r.Age = ageOf(svc)
	if len(svc.Spec.ExternalIPs) > 0 {
		r.RefusedExternalIPs = e.refusedExternalIPs(svc, vips)
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if a, ok := parseSloppyIP(in.IP); ok {
				r.LoadBalancerAddrs = append(r.LoadBalancerAddrs, a)
			}
		}
	}

	if len(svcSlices) > 1 && !slices.IsSortedFunc(svcSlices, bySliceName) {
		svcSlices = slices.Clone(svcSlices)
		slices.SortStableFunc(svcSlices, bySliceName)
	}
	var excluded map[excludedEndpointKey]ExcludedEndpoint
	sc := serviceCtx{env: e, svc: svc, network: bind.Network, netID: id, slices: svcSlices, excluded: &excluded}
	for _, vip := range vips {
		r.Services = append(r.Services, sc.servePorts(vip)...)
		r.Services = append(r.Services, sc.frontends(vip)...)
	}
	if len(sc.podAddrs) > 0 {
		slices.SortFunc(sc.podAddrs, netip.Addr.Compare)
		r.PodAddrs = slices.Clip(slices.Compact(sc.podAddrs))
	}
	for _, x := range excluded {
		r.Excluded = append(r.Excluded, x)
	}
	if hc := svc.Spec.HealthCheckNodePort; hc > 0 && hc <= 65535 && svc.Spec.Type == corev1.ServiceTypeLoadBalancer &&
		svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal && len(vips) > 0 {
		r.HealthCheck = &HealthCheck{Namespace: svc.Namespace, Name: svc.Name, Port: uint16(hc),
			LocalEndpoints: sc.localReady(vips[0])}
	}
	return r
}

// localReady counts the service's ready endpoints on this node among the
// slices of vip's family, each address once (kube-proxy's count of local
// endpoints for its health check).
func (c *serviceCtx) localReady(vip netip.Addr) int {
	seen := map[netip.Addr]bool{}
	for _, sp := range c.svc.Spec.Ports {
		for _, e := range c.endpoints(vip, sp) {
			if e.ready && c.local(e) {
				seen[e.addr] = true
			}
		}
	}
	return len(seen)
}

func bySliceName(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) }

// MergeServices assembles the state of a node from the results of its
// services, in any order (Skipped ones are ignored; in (namespace, name)
// order is cheapest): what ComputeServices returns for the same services.
func MergeServices(results []*ServiceResult) ServiceState {
	// Bound is sorted by (namespace, name); services are taken in that
	// order and then sorted stably by frontend, so that ties come out the
	// same whatever the input order.
	order := make([]*ServiceResult, 0, len(results))
	ports := 0
	for _, r := range results {
		if !r.Skipped {
			order = append(order, r)
			ports += len(r.Services)
		}
	}
	byName := func(a, b *ServiceResult) int {
		return cmp.Or(cmp.Compare(a.Binding.Namespace, b.Binding.Namespace), cmp.Compare(a.Binding.Name, b.Binding.Name))
	}
	// A caller that keeps its results in order is spared the sort.
	if !slices.IsSortedFunc(order, byName) {
		slices.SortStableFunc(order, byName)
	}
	fronts := make([]FrontendRef, 0, ports)
	for _, r := range order {
		for i := range r.Services {
			fronts = append(fronts, FrontendRef{r, i})
		}
	}
	slices.SortStableFunc(fronts, func(a, b FrontendRef) int { return compareFrontend(a.Entry(), b.Entry()) })
	return MergeSorted(order, fronts, nil)
}

// FrontendRef is one table entry of a service's result (R.Services[I]),
// as the merge orders them: a caller that keeps its results between
// merges (the agent) keeps these sorted too (CompareFrontends), and
// merges without sorting every service's entries again (MergeSorted).
type FrontendRef struct {
	R *ServiceResult
	I int
}

// Entry is the table entry f names.
func (f FrontendRef) Entry() *tables.Service { return &f.R.Services[f.I] }

func compareFrontend(a, b *tables.Service) int { return a.Key().Compare(b.Key()) }

// CompareFrontends orders entries as MergeServices does: by address,
// protocol and port, then (ties) by their Service's namespace and name
// and their place in its result, which is what the stable sort of results
// in (namespace, name) order gives when no Service is listed twice.
func CompareFrontends(a, b FrontendRef) int {
	return cmp.Or(compareFrontend(a.Entry(), b.Entry()),
		cmp.Compare(a.R.Binding.Namespace, b.R.Binding.Namespace), cmp.Compare(a.R.Binding.Name, b.R.Binding.Name), cmp.Compare(a.I, b.I))
}

// MergeSorted is MergeServices for order, the results in (namespace,
// name) order, and fronts, their entries in the merge's order; an entry
// whose result skip says is left out is not merged (nil: none is).
func MergeSorted(order []*ServiceResult, fronts []FrontendRef, skip func(*ServiceResult) bool) ServiceState {
	var st ServiceState
	excl := 0
	n := 0
	for _, r := range order {
		if !r.Skipped {
			n++
			excl += len(r.Excluded)
		}
	}
	if n > 0 {
		st.Bound = make([]ServiceBinding, 0, n)
	}
	if len(fronts) > 0 {
		st.Services = make([]tables.Service, 0, len(fronts))
	}
	if excl > 0 {
		st.Excluded = make([]ExcludedEndpoint, 0, excl)
	}
	live := order
	if n != len(order) {
		live = make([]*ServiceResult, 0, n)
		for _, r := range order {
			if !r.Skipped {
				live = append(live, r)
			}
		}
	}
	for _, r := range live {
		st.Bound = append(st.Bound, r.Binding)
		st.Excluded = append(st.Excluded, r.Excluded...)
		if r.HealthCheck != nil {
			st.HealthChecks = append(st.HealthChecks, *r.HealthCheck)
		}
	}
	// One per port (the API server allocates them apart; a stale object
	// may not): the first Service by namespace and name keeps it.
	slices.SortStableFunc(st.HealthChecks, func(a, b HealthCheck) int { return cmp.Compare(a.Port, b.Port) })
	st.HealthChecks = slices.CompactFunc(st.HealthChecks, func(a, b HealthCheck) bool { return a.Port == b.Port })
	// An address an external IP names has one owner across ports and
	// protocols: the other Services' external IP entries on it go.
	xown := externalOwners(live)
	// One entry per address, protocol and port: two Services may name the
	// same external IP (or one another's load balancer address). A
	// ClusterIP wins, then a NodePort, a load balancer address and last an
	// external IP (no Service takes another's address by naming it); the
	// oldest Service among equals (creation time, then UID), never the
	// first by name, so a newcomer cannot take an address that is served.
	var own owners // made at the first contest: they are rare
	for _, f := range fronts {
		if skip != nil && skip(f.R) {
			continue
		}
		sv := f.Entry()
		if xown != nil && sv.Frontend == tables.FrontendExternalIP && xown[sv.VIP].r != f.R {
			continue
		}
		if len(st.Services) == 0 {
			st.Services = append(st.Services, *sv)
			continue
		}
		last := &st.Services[len(st.Services)-1]
		if compareFrontend(sv, last) != 0 {
			st.Services = append(st.Services, *sv)
			continue
		}
		if own == nil {
			own = newOwners(live)
		}
		if own.wins(sv, last) {
			*last = *sv
		}
	}
	if len(st.Services) == 0 {
		st.Services = nil
	}
	slices.SortFunc(st.Excluded, func(a, b ExcludedEndpoint) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Service, b.Service), a.Addr.Compare(b.Addr))
	})
	return st
}

// binder is Bind for one kind with the policies sorted and their
// selectors parsed once, for binding many objects.
type binder struct {
	kind     lacev1.MatchKind
	policies []boundPolicy
}

type boundPolicy struct {
	p             *lacev1.NetworkBindingPolicy
	ns, sel       labels.Selector // nil: everything
	nsErr, selErr error
}

func newBinder(policies []lacev1.NetworkBindingPolicy, kind lacev1.MatchKind) binder {
	b := binder{kind: kind}
	for i := range policies {
		p := &policies[i]
		if p.DeletionTimestamp != nil || p.Spec.MatchKind != "" && p.Spec.MatchKind != kind {
			continue
		}
		bp := boundPolicy{p: p}
		if p.Spec.NamespaceSelector != nil {
			bp.ns, bp.nsErr = metav1.LabelSelectorAsSelector(p.Spec.NamespaceSelector)
		}
		if p.Spec.Selector != nil {
			bp.sel, bp.selErr = metav1.LabelSelectorAsSelector(p.Spec.Selector)
		}
		b.policies = append(b.policies, bp)
	}
	sort.SliceStable(b.policies, func(i, j int) bool {
		a, c := b.policies[i].p, b.policies[j].p
		if a.Spec.Priority != c.Spec.Priority {
			return a.Spec.Priority < c.Spec.Priority
		}
		return a.Name < c.Name
	})
	return b
}

// bind is Bind(policies, kind, namespace, name, objLabels, nsLabels).
func (b binder) bind(namespace, name string, objLabels, nsLabels map[string]string) (Binding, error) {
	for _, bp := range b.policies {
		if bp.nsErr != nil {
			return Binding{}, fmt.Errorf("NetworkBindingPolicy %s: namespaceSelector: %w", bp.p.Name, bp.nsErr)
		}
		if bp.ns != nil && !bp.ns.Matches(labels.Set(nsLabels)) {
			continue
		}
		if bp.selErr != nil {
			return Binding{}, fmt.Errorf("NetworkBindingPolicy %s: selector: %w", bp.p.Name, bp.selErr)
		}
		if bp.sel == nil || bp.sel.Matches(labels.Set(objLabels)) {
			return Binding{Network: bp.p.Spec.Network, Policy: bp.p.Name}, nil
		}
	}
	return Binding{}, fmt.Errorf("no NetworkBindingPolicy matches %s %s/%s", kindWord(b.kind), namespace, name)
}

// serviceVIPs returns the service's ClusterIPs, or false when Lace leaves
// the service alone: kube-proxy's ShouldSkipService (headless: clusterIP
// None or empty; type ExternalName), the service-proxy-name and headless
// labels (which kube-proxy's informers filter out), and ClusterIPs that
// don't parse.
func serviceVIPs(svc *corev1.Service) ([]netip.Addr, bool) {
	if svc.Spec.Type == corev1.ServiceTypeExternalName ||
		svc.Spec.ClusterIP == corev1.ClusterIPNone || svc.Spec.ClusterIP == "" {
		return nil, false
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return nil, false
	}
	// kube-proxy's informers filter Services (not only their slices) with
	// the headless label, whatever their clusterIP (a conformance spec
	// checks it).
	if _, ok := svc.Labels[corev1.IsHeadlessService]; ok {
		return nil, false
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		// An object from before dual-stack has clusterIP only; kube-proxy
		// (GetClusterIPByFamily) falls back to it the same way.
		ips = []string{svc.Spec.ClusterIP}
	}
	out := make([]netip.Addr, 0, len(ips))
	for _, s := range ips {
		a, ok := parseSloppyIP(s)
		if !ok {
			return nil, false
		}
		out = append(out, a)
	}
	return out, true
}

// parseSloppyIP parses an address as kube-proxy does (ParseIPSloppy: IPv4 octets
// with leading zeros, which old objects may hold, read as decimal).
func parseSloppyIP(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Addr{}, false
		}
		return a.Unmap(), true
	}
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	if v4 := ip.To4(); v4 != nil && !strings.Contains(s, ":") {
		return netip.AddrFrom4([4]byte(v4)), true
	}
	a, ok := netip.AddrFromSlice(ip.To16())
	return a.Unmap(), ok
}

// IPProto is the IP protocol number of a Service's or container port's
// protocol ("" is the API's default, TCP); ok is false for any other.
func IPProto(p corev1.Protocol) (proto uint8, ok bool) {
	switch p {
	case corev1.ProtocolTCP, "": // "" is the API default, TCP
		return 6, true
	case corev1.ProtocolUDP:
		return 17, true
	case corev1.ProtocolSCTP:
		return 132, true
	}
	return 0, false
}

// SlicesByService groups EndpointSlices by the service they belong to
// (SliceService), each group sorted by slice name.
func SlicesByService(all []discoveryv1.EndpointSlice) map[ServiceKey][]*discoveryv1.EndpointSlice {
	out := map[ServiceKey][]*discoveryv1.EndpointSlice{}
	for i := range all {
		s := &all[i]
		if k, ok := SliceService(s); ok {
			out[k] = append(out[k], s)
		}
	}
	for _, ss := range out {
		slices.SortStableFunc(ss, bySliceName)
	}
	return out
}

// SliceService is the service an EndpointSlice belongs to
// (namespace/kubernetes.io/service-name), false for nobody's: slices
// without the label (kube-proxy's endpointSliceCacheKeys rejects them), and
// slices with the service-proxy-name or headless labels, which
// kube-proxy's informers ignore.
func SliceService(s *discoveryv1.EndpointSlice) (ServiceKey, bool) {
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return ServiceKey{}, false
	}
	if _, ok := s.Labels[LabelServiceProxyName]; ok {
		return ServiceKey{}, false
	}
	if _, ok := s.Labels[corev1.IsHeadlessService]; ok {
		return ServiceKey{}, false
	}
	return ServiceKeyOf(s.Namespace, name), true
}

// PodAddrIndex says which networks hold a pod address, from
// NetworkEndpoints. A service's result depends on it only through the
// addresses it looked up (ServiceResult.PodAddrs): a NetworkEndpoint
// change matters to the services that have one of its addresses, old or
// new, as an endpoint, and to no other.
type PodAddrIndex struct {
	// byAddr has the NetworkEndpoints that hold each address (one,
	// unless networks overlap); byPod each by name (a NetworkEndpoint is
	// named after its pod).
	byAddr FirstSet[netip.Addr, *lacev1.NetworkEndpoint]
	byPod  map[types.NamespacedName]*lacev1.NetworkEndpoint
}

// NewPodAddrIndex is an empty index.
func NewPodAddrIndex() *PodAddrIndex {
	return &PodAddrIndex{byAddr: NewFirstSet[netip.Addr, *lacev1.NetworkEndpoint](), byPod: map[types.NamespacedName]*lacev1.NetworkEndpoint{}}
}

// Add indexes ne, which must not be modified while it is indexed. One
// of a name already indexed replaces it.
func (ix *PodAddrIndex) Add(ne *lacev1.NetworkEndpoint) {
	k := types.NamespacedName{Namespace: ne.Namespace, Name: ne.Name}
	if old := ix.byPod[k]; old != nil {
		ix.Remove(old)
	}
	ix.byPod[k] = ne
	for _, a := range NetworkEndpointAddrs(ne) {
		ix.byAddr.Add(a, ne)
	}
}

// Remove takes ne (the pointer Add was given) out of the index.
func (ix *PodAddrIndex) Remove(ne *lacev1.NetworkEndpoint) {
	k := types.NamespacedName{Namespace: ne.Namespace, Name: ne.Name}
	if ix.byPod[k] == ne {
		delete(ix.byPod, k)
	}
	for _, a := range NetworkEndpointAddrs(ne) {
		ix.byAddr.Remove(a, ne)
	}
}

// Each calls fn with the name of every NetworkEndpoint indexed.
func (ix *PodAddrIndex) Each(fn func(types.NamespacedName)) {
	for k := range ix.byPod {
		fn(k)
	}
}

// Get is the NetworkEndpoint indexed by name k, or nil.
func (ix *PodAddrIndex) Get(k types.NamespacedName) *lacev1.NetworkEndpoint { return ix.byPod[k] }

// PodIndexOf indexes what ComputeServices looks up for the endpoints of
// slices: of an endpoint on a node, the NetworkEndpoints of that node
// holding its address (byAddr) and the one its target pod names (byName,
// nil when none); an endpoint on no node looks nothing up. A caller
// computing a few services thus reads the NetworkEndpoints of their
// endpoints instead of every one in the cluster. Each (node, address) and
// each pod is looked up once, however many endpoints name it: a tenant's
// slices cannot make one computation read a NetworkEndpoint twice.
func PodIndexOf(slices []discoveryv1.EndpointSlice, byAddr func(node string, a netip.Addr) ([]*lacev1.NetworkEndpoint, error),
	byName func(types.NamespacedName) (*lacev1.NetworkEndpoint, error)) (*PodAddrIndex, error) {
	ix := NewPodAddrIndex()
	type at struct {
		node string
		addr netip.Addr
	}
	seenAt, seenPod := map[at]bool{}, map[types.NamespacedName]bool{}
	for _, sl := range slices {
		for i := range sl.Endpoints {
			ep := &sl.Endpoints[i]
			if len(ep.Addresses) == 0 || ep.NodeName == nil || *ep.NodeName == "" {
				continue
			}
			if addr, ok := parseSloppyIP(ep.Addresses[0]); ok && !seenAt[at{*ep.NodeName, addr}] {
				seenAt[at{*ep.NodeName, addr}] = true
				nes, err := byAddr(*ep.NodeName, addr)
				if err != nil {
					return nil, err
				}
				for _, ne := range nes {
					ix.Add(ne)
				}
			}
			if pod, ok := targetPodOf(sl.Namespace, ep); ok && !seenPod[pod] {
				seenPod[pod] = true
				if ix.byPod[pod] != nil {
					continue
				}
				ne, err := byName(pod)
				if err != nil {
					return nil, err
				}
				if ne != nil {
					ix.Add(ne)
				}
			}
		}
	}
	return ix, nil
}

// NodeAddrKey is how a NetworkEndpoint is indexed by node and address
// (PodIndexOf's lookups).
func NodeAddrKey(node string, a netip.Addr) string { return node + "/" + a.String() }

// NetworkEndpointAddrs are the addresses ne holds, as the index reads
// them.
func NetworkEndpointAddrs(ne *lacev1.NetworkEndpoint) []netip.Addr {
	out := make([]netip.Addr, 0, len(ne.Spec.Addresses))
	for _, s := range ne.Spec.Addresses {
		if a, ok := parseSloppyIP(string(s)); ok && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

func neHolds(ne *lacev1.NetworkEndpoint, a netip.Addr) bool {
	for _, s := range ne.Spec.Addresses {
		if b, ok := parseSloppyIP(string(s)); ok && b == a {
			return true
		}
	}
	return false
}

// otherNetwork returns "" when addr may be an endpoint of a service in
// network, or the network(s) whose pod holds it instead.
//
// A NetworkEndpoint is written by the agent of the node it names, and the
// admission policy can check only that: any agent may write
// NetworkEndpoints for its own node, in any namespace, naming any address
// and any pod. So a NetworkEndpoint counts only for an endpoint the
// EndpointSlice (the endpoint controller, not an agent) places on that
// node: spec.node must be the endpoint's nodeName. A node then speaks only
// about endpoints it hosts, which it could misroute anyway; it can neither
// take the API server's address out of the kubernetes Service (no
// nodeName) nor squat the NetworkEndpoint of another node's pod.
//
// The pod the EndpointSlice names (targetRef) decides when its
// NetworkEndpoint (same name, same pod-uid label) holds the address: with
// overlapping networks an address can be a pod's in the service's network
// and another pod's elsewhere, and the targetRef tells which pod the
// endpoint controller meant. Otherwise the address decides among the
// node's NetworkEndpoints: it is in the network when one of that network
// holds it, whatever others do. When none holds it (or the endpoint names
// no node), it is an outside address (the kubernetes Service's API server
// address) reached from the service's network like any outside address.
func (ix *PodAddrIndex) otherNetwork(sliceNS string, ep *discoveryv1.Endpoint, addr netip.Addr, network string) string {
	if ep.NodeName == nil || *ep.NodeName == "" {
		return ""
	}
	node := *ep.NodeName
	if pod, ok := targetPodOf(sliceNS, ep); ok {
		if r, ne := ep.TargetRef, ix.byPod[pod]; ne != nil {
			if ne.Spec.Node == node && neHolds(ne, addr) && (r.UID == "" || string(r.UID) == ne.Labels[lacev1.LabelPodUID]) {
				if ne.Spec.Network == network {
					return ""
				}
				return ne.Spec.Network
			}
		}
	}
	var others []string
	in := false
	ix.byAddr.Each(addr, func(ne *lacev1.NetworkEndpoint) bool {
		if ne.Spec.Node != node {
			return true
		}
		if ne.Spec.Network == network {
			in = true
			return false
		}
		if !slices.Contains(others, ne.Spec.Network) {
			others = append(others, ne.Spec.Network)
		}
		return true
	})
	if in {
		return ""
	}
	slices.Sort(others)
	return strings.Join(others, ",")
}

// targetPodOf is the pod an endpoint's targetRef names, if it names one.
func targetPodOf(sliceNS string, ep *discoveryv1.Endpoint) (types.NamespacedName, bool) {
	r := ep.TargetRef
	if r == nil || (r.Kind != "" && r.Kind != "Pod") || r.Name == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: cmp.Or(r.Namespace, sliceNS), Name: r.Name}, true
}

// reusedBy returns, for an endpoint whose targetRef names a pod that does
// not hold addr on the endpoint's node, another pod that holds it there
// in network ("" when none does). One address is one pod's in a network
// on a node, so the endpoint is stale: its pod came back at a new address
// (a node reboot) or is gone, the EndpointSlice has not caught up, and
// the address was given to the next pod, maybe another tenant's, which a
// tenant creating pods could aim for.
//
// When the named pod's own NetworkEndpoint lists the address, it is
// served whatever else does: that record is the agent's word for what it
// attached, while another may be left behind by a pod whose DEL raced its
// record's write (a gone pod's record would otherwise take a live pod out
// of its Services for as long as it stays). The cost is the moment
// between a pod's restart at a new address and its record's rewrite.
func (ix *PodAddrIndex) reusedBy(sliceNS string, ep *discoveryv1.Endpoint, addr netip.Addr, network string) string {
	want, ok := targetPodOf(sliceNS, ep)
	if ep.NodeName == nil || *ep.NodeName == "" || !ok {
		return ""
	}
	node := *ep.NodeName
	if ne := ix.byPod[want]; ne != nil && ne.Spec.Node == node && neHolds(ne, addr) {
		return ""
	}
	// The first holder by name: the answer must not depend on the order
	// the NetworkEndpoints came in.
	holder := ""
	ix.byAddr.Each(addr, func(ne *lacev1.NetworkEndpoint) bool {
		if ne.Spec.Node == node && ne.Spec.Network == network && (ne.Namespace != want.Namespace || ne.Name != want.Name) {
			if h := ne.Namespace + "/" + ne.Name; holder == "" || h < holder {
				holder = h
			}
		}
		return true
	})
	return holder
}

type excludedEndpointKey struct {
	ns, svc string
	addr    netip.Addr
}

// serviceCtx is one bound service being turned into table entries.
type serviceCtx struct {
	env     *ServiceEnv
	svc     *corev1.Service
	network string
	netID   uint32
	slices  []*discoveryv1.EndpointSlice
	// excluded is made at the first endpoint left out.
	excluded *map[excludedEndpointKey]ExcludedEndpoint
	// podAddrs are the addresses looked up in env.pods (repeated).
	podAddrs []netip.Addr
}

// exclude records x (its address and why) as left out of the service, once
// per address.
func (c *serviceCtx) exclude(x ExcludedEndpoint) {
	k := excludedEndpointKey{c.svc.Namespace, c.svc.Name, x.Addr}
	if *c.excluded == nil {
		*c.excluded = map[excludedEndpointKey]ExcludedEndpoint{}
	}
	if _, ok := (*c.excluded)[k]; !ok {
		x.Namespace, x.Service, x.ServiceNetwork = c.svc.Namespace, c.svc.Name, c.network
		(*c.excluded)[k] = x
	}
}

// svcEndpoint is one (address, port) of a service port with what eligibility
// needs to know of it.
type svcEndpoint struct {
	addr                      netip.Addr
	port                      uint16
	node, zone                string
	ready, serving, terminate bool
	forZones, forNodes        []string
}

// servePorts returns the table entries of every port of the service on vip.
func (c *serviceCtx) servePorts(vip netip.Addr) []tables.Service {
	var out []tables.Service
	seen := map[[2]int32]bool{} // (port, proto): the API forbids duplicates; be deterministic anyway
	for _, sp := range c.svc.Spec.Ports {
		proto, ok := IPProto(sp.Protocol)
		if !ok || sp.Port <= 0 || sp.Port > 65535 || seen[[2]int32{sp.Port, int32(proto)}] {
			continue
		}
		seen[[2]int32{sp.Port, int32(proto)}] = true
		eps := c.endpoints(vip, sp)
		backends, drop := eligibleEndpoints(eps, c.svc, c.env.node, c.env.zone)
		s := tables.Service{VIP: vip, Proto: proto, Port: uint16(sp.Port), NetID: c.netID, Drop: drop,
			AffinitySeconds: affinitySeconds(c.svc), Lingering: lingering(eps, backends)}
		if len(backends) > 0 {
			s.Backends = make([]tables.Backend, 0, len(backends))
		}
		for _, e := range backends {
			s.Backends = append(s.Backends, tables.Backend{Addr: e.addr, Port: e.port})
		}
		slices.SortFunc(s.Backends, compareBackends)
		out = append(out, s)
	}
	return out
}

// frontends returns the external frontends of the service's ClusterIP
// clusterIP's family: its NodePorts on this node's address of that
// family, its LoadBalancer ingress addresses (but those of ipMode Proxy,
// which in-cluster clients must reach through the load balancer, as
// kube-proxy leaves them) and its external IPs, each port with the
// endpoints its externalTrafficPolicy makes eligible here.
func (c *serviceCtx) frontends(clusterIP netip.Addr) []tables.Service {
	svc := c.svc
	type front struct {
		addr netip.Addr
		kind tables.Frontend
	}
	var fronts []front
	if svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, a := range c.env.nodeAddrs {
			if a.Is4() == clusterIP.Is4() {
				fronts = append(fronts, front{a, tables.FrontendNodePort})
			}
		}
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IPMode != nil && *in.IPMode == corev1.LoadBalancerIPModeProxy {
				continue
			}
			if a, ok := parseSloppyIP(in.IP); ok && a.Is4() == clusterIP.Is4() {
				fronts = append(fronts, front{a, tables.FrontendLoadBalancer})
			}
		}
	}
	for _, a := range c.externalIPs(clusterIP) {
		fronts = append(fronts, front{a, tables.FrontendExternalIP})
	}
	if len(fronts) == 0 {
		return nil
	}
	local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	ranges := sourceRanges(svc, clusterIP.Is4())
	var out []tables.Service
	seen := map[[2]int32]bool{}
	for _, sp := range svc.Spec.Ports {
		proto, ok := IPProto(sp.Protocol)
		if !ok || sp.Port <= 0 || sp.Port > 65535 || seen[[2]int32{sp.Port, int32(proto)}] {
			continue
		}
		seen[[2]int32{sp.Port, int32(proto)}] = true
		eps := c.endpoints(clusterIP, sp)
		var eligible []svcEndpoint
		drop := false
		if local {
			eligible, drop = localEndpoints(eps, c.env.node)
		} else {
			eligible = clusterEndpoints(eps, svc, c.env.node, c.env.zone)
		}
		linger := lingering(eps, eligible)
		var backends []tables.Backend
		if len(eligible) > 0 {
			backends = make([]tables.Backend, 0, len(eligible))
			for _, e := range eligible {
				backends = append(backends, tables.Backend{Addr: e.addr, Port: e.port})
			}
			slices.SortFunc(backends, compareBackends)
		}
		for _, f := range fronts {
			port := sp.Port
			if f.kind == tables.FrontendNodePort {
				// allocateLoadBalancerNodePorts false leaves it 0.
				if sp.NodePort <= 0 || sp.NodePort > 65535 {
					continue
				}
				port = sp.NodePort
			}
			s := tables.Service{VIP: f.addr, Proto: proto, Port: uint16(port), NetID: c.netID, Drop: drop,
				AffinitySeconds: affinitySeconds(svc), Backends: backends, Lingering: linger, Frontend: f.kind,
				ClusterIP: clusterIP, ClusterPort: uint16(sp.Port), Local: local}
			if f.kind != tables.FrontendNodePort {
				s.SourceRanges = ranges
			}
			out = append(out, s)
		}
	}
	return out
}

// compareBackends orders backends by address, then port: the order of a
// table entry's Backends and Lingering.
func compareBackends(a, b tables.Backend) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
}

// lingering are the endpoints of eps not among used (the backends), as
// table backends, sorted; nil when there are none.
func lingering(eps, used []svcEndpoint) []tables.Backend {
	if len(eps) == len(used) {
		return nil // used is a subset of eps, without duplicates
	}
	in := make(map[netip.AddrPort]bool, len(used))
	for _, e := range used {
		in[netip.AddrPortFrom(e.addr, e.port)] = true
	}
	var out []tables.Backend
	for _, e := range eps {
		if !in[netip.AddrPortFrom(e.addr, e.port)] {
			out = append(out, tables.Backend{Addr: e.addr, Port: e.port})
		}
	}
	slices.SortFunc(out, compareBackends)
	return out
}

// sourceRanges are the service's loadBalancerSourceRanges of one family,
// masked, sorted and without duplicates (kube-proxy ignores what does not
// parse, and so does Lace).
func sourceRanges(svc *corev1.Service, v4 bool) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range svc.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil || p.Addr().Is4() != v4 {
			continue
		}
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return cmp.Or(a.Addr().Compare(b.Addr()), a.Bits()-b.Bits()) })
	return slices.Compact(out)
}

// affinitySeconds: ClientIP affinity with its timeout, 10800 s when unset
// (the API default, which kube-proxy relies on the apiserver to fill in).
func affinitySeconds(svc *corev1.Service) uint32 {
	if svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		return 0
	}
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil &&
		*c.ClientIP.TimeoutSeconds > 0 {
		return uint32(*c.ClientIP.TimeoutSeconds)
	}
	return uint32(corev1.DefaultClientIPServiceAffinitySeconds)
}

// endpoints collects the endpoints of service port sp on vip from the
// service's slices, as kube-proxy's EndpointSliceCache does: slices of the
// VIP's address type only, the slice port with the service port's name
// (nil names and nil or zero ports ignored) and protocol, the first address
// of each endpoint, deduplicated by (address, port) with an endpoint on this
// node winning over a copy elsewhere. Endpoints of pods of other networks
// are left out and recorded.
func (c *serviceCtx) endpoints(vip netip.Addr, sp corev1.ServicePort) []svcEndpoint {
	addrType := discoveryv1.AddressTypeIPv4
	if vip.Is6() {
		addrType = discoveryv1.AddressTypeIPv6
	}
	spProto := cmp.Or(sp.Protocol, corev1.ProtocolTCP)
	var out []svcEndpoint
	var at map[netip.AddrPort]int
	for _, sl := range c.slices {
		if sl.AddressType != addrType {
			continue
		}
		for _, p := range sl.Ports {
			if p.Name == nil || *p.Name != sp.Name || p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
				continue
			}
			proto := corev1.ProtocolTCP // the API default
			if p.Protocol != nil && *p.Protocol != "" {
				proto = *p.Protocol
			}
			if proto != spProto {
				continue
			}
			for i := range sl.Endpoints {
				ep := &sl.Endpoints[i]
				if len(ep.Addresses) == 0 {
					continue
				}
				addr, ok := parseSloppyIP(ep.Addresses[0])
				if !ok || addr.Is6() != vip.Is6() {
					continue
				}
				if sl.Namespace != c.svc.Namespace {
					continue
				}
				if why := c.env.hostEPs.Refused(c.svc, ep, addr); why != "" {
					c.exclude(ExcludedEndpoint{Addr: addr, Refused: why})
					continue
				}
				if ep.NodeName != nil && *ep.NodeName != "" {
					c.podAddrs = append(c.podAddrs, addr)
				}
				if other := c.env.pods.otherNetwork(sl.Namespace, ep, addr, c.network); other != "" {
					c.exclude(ExcludedEndpoint{Addr: addr, Network: other})
					continue
				}
				if holder := c.env.pods.reusedBy(sl.Namespace, ep, addr, c.network); holder != "" {
					c.exclude(ExcludedEndpoint{Addr: addr, Refused: "the address is pod " + holder + "'s now, not the endpoint's pod's"})
					continue
				}
				e := svcEndpoint{addr: addr, port: uint16(*p.Port), zone: derefString(ep.Zone), node: derefString(ep.NodeName),
					ready:     ep.Conditions.Ready == nil || *ep.Conditions.Ready,
					serving:   ep.Conditions.Serving == nil || *ep.Conditions.Serving,
					terminate: ep.Conditions.Terminating != nil && *ep.Conditions.Terminating}
				if h := ep.Hints; h != nil {
					for _, z := range h.ForZones {
						e.forZones = append(e.forZones, z.Name)
					}
					for _, n := range h.ForNodes {
						e.forNodes = append(e.forNodes, n.Name)
					}
				}
				k := netip.AddrPortFrom(addr, e.port)
				if at == nil {
					at = make(map[netip.AddrPort]int, len(sl.Endpoints))
					out = make([]svcEndpoint, 0, len(sl.Endpoints))
				}
				if j, dup := at[k]; dup {
					if c.local(e) {
						out[j] = e
					}
					continue
				}
				at[k] = len(out)
				out = append(out, e)
			}
		}
	}
	return out
}

func (c *serviceCtx) local(e svcEndpoint) bool { return c.env.node != "" && e.node == c.env.node }

func derefString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// eligibleEndpoints picks the endpoints this node sends ClusterIP traffic to, and
// whether traffic is dropped (rather than rejected) when there are none. It
// follows kube-proxy's CategorizeEndpoints and the nftables proxier:
//
//   - "usable" means ready (ready unset counts as ready); when no endpoint
//     is ready, serving and terminating ones are used instead; an endpoint
//     neither ready nor serving-terminating is never used;
//   - a service with no usable endpoint anywhere has no backends and is
//     rejected (ICMP unreachable), whatever its traffic policy;
//   - internalTrafficPolicy Local: the ready endpoints on this node, else
//     the serving-terminating ones on this node; none here while some exist
//     elsewhere drops (topology plays no part: every candidate is here);
//   - Cluster: the ready endpoints filtered by topology (hints, or Lace's
//     PreferClosest annotation); the terminating fallback ignores topology,
//     as there is no ready endpoint anywhere to prefer.
func eligibleEndpoints(eps []svcEndpoint, svc *corev1.Service, node, zone string) ([]svcEndpoint, bool) {
	if p := svc.Spec.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
		return localEndpoints(eps, node)
	}
	return clusterEndpoints(eps, svc, node, zone), false
}

func usable(e svcEndpoint) bool { return e.ready || (e.serving && e.terminate) }

// localEndpoints are a traffic policy Local's endpoints: the ready ones on
// this node, else its serving-terminating ones; none here while some exist
// elsewhere drops (true). No usable endpoint anywhere rejects.
func localEndpoints(eps []svcEndpoint, node string) ([]svcEndpoint, bool) {
	if !slices.ContainsFunc(eps, usable) {
		return nil, false
	}
	isLocal := func(e svcEndpoint) bool { return node != "" && e.node == node }
	local := filterEndpoints(eps, func(e svcEndpoint) bool { return isLocal(e) && e.ready })
	if len(local) == 0 {
		local = filterEndpoints(eps, func(e svcEndpoint) bool { return isLocal(e) && e.serving && e.terminate })
	}
	return local, len(local) == 0
}

// clusterEndpoints are a traffic policy Cluster's endpoints: the ready
// ones filtered by topology, else the serving-terminating ones.
func clusterEndpoints(eps []svcEndpoint, svc *corev1.Service, node, zone string) []svcEndpoint {
	isLocal := func(e svcEndpoint) bool { return node != "" && e.node == node }
	ready := filterEndpoints(eps, func(e svcEndpoint) bool { return e.ready })
	if len(ready) == 0 {
		return filterEndpoints(eps, func(e svcEndpoint) bool { return e.serving && e.terminate })
	}
	if svc.Annotations[lacev1.AnnotationTrafficDistribution] == TrafficDistributionPreferClosest {
		// Lace's tiers: the first non-empty one of ready endpoints wins;
		// hints play no part.
		if t := filterEndpoints(ready, isLocal); len(t) > 0 {
			return t
		}
		if t := filterEndpoints(ready, func(e svcEndpoint) bool { return zone != "" && e.zone == zone }); len(t) > 0 {
			return t
		}
		return ready
	}
	switch topologyModeFromHints(ready, node, zone) {
	case corev1.ServiceTrafficDistributionPreferSameNode:
		return filterEndpoints(ready, func(e svcEndpoint) bool { return slices.Contains(e.forNodes, node) })
	case corev1.ServiceTrafficDistributionPreferSameZone:
		return filterEndpoints(ready, func(e svcEndpoint) bool { return slices.Contains(e.forZones, zone) })
	}
	return ready
}

// topologyModeFromHints is kube-proxy's topologyModeFromHints (with the
// PreferSameTrafficDistribution gate on, its default in v1.34): node hints
// are used when every ready endpoint has one and one names this node, else
// zone hints when every ready endpoint has one and one names this zone,
// else none (all ready endpoints). Like kube-proxy v1.34 it reads hints
// only: the service.kubernetes.io/topology-mode (and older
// topology-aware-hints) annotation and spec.trafficDistribution matter to
// the EndpointSlice controller, which writes the hints, not to the proxy.
func topologyModeFromHints(ready []svcEndpoint, node, zone string) string {
	allNode, forNode, allZone, forZone := true, false, true, false
	for _, e := range ready {
		if len(e.forNodes) == 0 {
			allNode = false
		} else if slices.Contains(e.forNodes, node) {
			forNode = true
		}
		if len(e.forZones) == 0 {
			allZone = false
		} else if slices.Contains(e.forZones, zone) {
			forZone = true
		}
	}
	switch {
	case allNode && forNode:
		return corev1.ServiceTrafficDistributionPreferSameNode
	case allZone && forZone:
		return corev1.ServiceTrafficDistributionPreferSameZone
	}
	return ""
}

// filterEndpoints returns the endpoints keep keeps: eps itself when it
// keeps them all (the common case: every endpoint ready), which callers
// only read.
func filterEndpoints(eps []svcEndpoint, keep func(svcEndpoint) bool) []svcEndpoint {
	n := 0
	for i := range eps {
		if keep(eps[i]) {
			n++
		}
	}
	if n == len(eps) || n == 0 {
		if n == 0 {
			return nil
		}
		return eps
	}
	out := make([]svcEndpoint, 0, n)
	for _, e := range eps {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// ClassifyAddr is the external network a node address classifies into
// (longest external prefix of cls), 0 for none: its view says which
// ClusterIPs the node's sockets reach and which NodePorts open on it.
func ClassifyAddr(cls []tables.Classifier, a netip.Addr) uint32 {
	if !a.IsValid() {
		return 0
	}
	best, id := -1, uint32(0)
	for _, c := range cls {
		if c.Prefix.Contains(a) && c.Prefix.Bits() > best {
			best, id = c.Prefix.Bits(), c.NetID
		}
	}
	return id
}

// GateNodePorts closes the NodePorts no policy opens on their node
// address (docs/services.md, "Reached from outside"): the address
// classifies into an external network E (st.Classifiers, longest
// prefix), and the NodePort is open when E's view reaches the service,
// i.e. holds its ClusterIP as a service of its network (a
// NetworkRoutingPolicy from E to the network, or a ServiceRoutingPolicy
// from E selecting the service). svcs is not modified: the result shares
// it unless something closes.
func GateNodePorts(svcs []tables.Service, st *NodeState) []tables.Service {
	out, _ := gateNodePorts(svcs, st, nil)
	return out
}

// gateNodePorts is GateNodePorts, with the keys of the entries it
// changed (sorted, as svcs is): the data plane visits those beside the
// merge's own changes. at, when not nil, are the node addresses, the only
// ones a NodePort entry has: the gate then visits their entries alone,
// found by key, with no pass over the list.
func gateNodePorts(svcs []tables.Service, st *NodeState, at []netip.Addr) (out []tables.Service, changed []tables.FrontendKey) {
	var nodePorts []int
	if at == nil {
		for i := range svcs {
			if svcs[i].Frontend == tables.FrontendNodePort {
				nodePorts = append(nodePorts, i)
			}
		}
	} else {
		for _, a := range slices.Compact(slices.SortedFunc(slices.Values(at), netip.Addr.Compare)) {
			i, _ := tables.FindFrontend(svcs, tables.FrontendKey{VIP: a})
			for ; i < len(svcs) && svcs[i].VIP == a; i++ {
				if svcs[i].Frontend == tables.FrontendNodePort {
					nodePorts = append(nodePorts, i)
				}
			}
		}
	}
	if len(nodePorts) == 0 {
		return svcs, nil
	}
	type reach struct {
		view uint32
		vip  netip.Addr
	}
	ext := map[netip.Addr]uint32{} // node address -> its external network
	open := map[reach]uint32{}     // (view, ClusterIP) -> the service's network
	views := map[uint32]bool{}
	for _, i := range nodePorts {
		a := svcs[i].VIP
		if _, done := ext[a]; !done {
			ext[a] = ClassifyAddr(st.Classifiers, a)
			views[ext[a]] = true
		}
	}
	for _, r := range st.Routes {
		if r.Kind == tables.RouteService && views[r.NetID] && r.Prefix.IsSingleIP() {
			open[reach{r.NetID, r.Prefix.Addr()}] = r.DstNet
		}
	}
	out = svcs
	for _, i := range nodePorts {
		s := &svcs[i]
		e := ext[s.VIP]
		net, ok := open[reach{e, s.ClusterIP}]
		closed := e == 0 || !ok || net != s.NetID
		if closed == s.Closed {
			continue
		}
		if &out[0] == &svcs[0] {
			out = slices.Clone(svcs)
		}
		out[i].Closed = closed
		changed = append(changed, s.Key())
	}
	return out, changed
}

// BoundServiceVIPs are the ClusterIPs of the services bound to a network
// (bound, from ComputeServices), for the views (NodeInput.Services).
func BoundServiceVIPs(svcs []corev1.Service, bound []ServiceBinding) []ServiceVIPs {
	network := map[[2]string]string{}
	for _, b := range bound {
		if b.Err == "" {
			network[[2]string{b.Namespace, b.Name}] = b.Network
		}
	}
	var out []ServiceVIPs
	for i := range svcs {
		svc := &svcs[i]
		n, ok := network[[2]string{svc.Namespace, svc.Name}]
		if !ok {
			continue
		}
		out = append(out, ServiceVIPs{Namespace: svc.Namespace, Name: svc.Name, Network: n, VIPs: clusterIPs(svc)})
	}
	return out
}

// clusterIPs are the service's ClusterIPs as its entries carry them
// (serviceVIPs: sloppy parsing, spec.clusterIP when clusterIPs is empty),
// so the views reach every address a table entry serves.
func clusterIPs(svc *corev1.Service) []netip.Addr {
	vips, _ := serviceVIPs(svc)
	return vips
}

// ServiceCIDRPrefixes are the prefixes of the cluster's ServiceCIDRs
// (NodeInput.ServiceCIDRs).
func ServiceCIDRPrefixes(cidrs []networkingv1.ServiceCIDR) []netip.Prefix {
	var out []netip.Prefix
	for _, sc := range cidrs {
		for _, c := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}
