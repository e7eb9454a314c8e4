package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// LoadBalancer VIP allocation (issue 11, docs/load-balancers.md): pure, so
// the controller's one writer and the tests compute the same thing.

// Reasons of a class's Ready condition and of Service Events.
const (
	LBReasonReady            = "Ready"
	LBReasonInvalidRange     = "InvalidRange"
	LBReasonOverlap          = "Overlap"
	LBReasonMultipleDefaults = "MultipleDefaults"

	LBReasonAllocated          = "LoadBalancerIPAllocated"
	LBReasonPoolExhausted      = "PoolExhausted"
	LBReasonAddressConflict    = "AddressConflict"
	LBReasonAddressNotInPool   = "AddressNotInPool"
	LBReasonUnsupportedFamily  = "UnsupportedFamily"
	LBReasonNoClass            = "NoLoadBalancerClass"
	LBReasonInvalidRequestedIP = "InvalidRequestedIP"
	// The class's namespaceSelector does not select the Service's
	// namespace; its addressRequestNamespaceSelector does not let it ask
	// for a specific address. Either way the Service holds nothing.
	LBReasonNamespaceNotAllowed      = "NamespaceNotAllowed"
	LBReasonAddressRequestNotAllowed = "AddressRequestNotAllowed"
)

// IPRange is an inclusive range of addresses of one family.
type IPRange struct{ First, Last netip.Addr }

// ParseAddressRange reads a CIDR (its usable addresses: an IPv4 prefix
// shorter than /31 loses its network and broadcast addresses, an IPv6 one
// shorter than /127 its subnet-router anycast address) or a
// first-last range. The API's validation leaves the order of IPv6 range
// ends to here (CEL has no IPv6 comparison).
func ParseAddressRange(s lacev1.AddressRange) (IPRange, error) {
	str := string(s)
	if p, err := netip.ParsePrefix(str); err == nil {
		if p != p.Masked() {
			return IPRange{}, fmt.Errorf("%s has host bits set", str)
		}
		if p.Addr().Is4In6() {
			return IPRange{}, fmt.Errorf("%s is an IPv4-mapped prefix", str)
		}
		first, last := p.Addr(), lastOf(p)
		switch {
		case p.Addr().Is4() && p.Bits() < 31:
			first, last = first.Next(), last.Prev()
		case p.Addr().Is6() && p.Bits() < 127:
			first = first.Next() // the subnet-router anycast address
		}
		return IPRange{First: first, Last: last}, nil
	}
	a, b, ok := strings.Cut(str, "-")
	if !ok {
		return IPRange{}, fmt.Errorf("%s is neither a CIDR nor a first-last range", str)
	}
	first, err1 := netip.ParseAddr(strings.TrimSpace(a))
	last, err2 := netip.ParseAddr(strings.TrimSpace(b))
	switch {
	case err1 != nil || err2 != nil:
		return IPRange{}, fmt.Errorf("%s: ends are not IP addresses", str)
	case first.Is4() != last.Is4():
		return IPRange{}, fmt.Errorf("%s: ends of different families", str)
	case last.Less(first):
		return IPRange{}, fmt.Errorf("%s: the first address is above the last", str)
	}
	return IPRange{First: first.Unmap(), Last: last.Unmap()}, nil
}

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := range b {
		hostBits := max(0, min(8, (i+1)*8-p.Bits()))
		b[i] |= byte(1<<hostBits - 1)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Contains tells whether a is in the range.
func (r IPRange) Contains(a netip.Addr) bool {
	return a.Is4() == r.First.Is4() && !a.Less(r.First) && !r.Last.Less(a)
}

func (r IPRange) overlaps(o IPRange) bool {
	return r.First.Is4() == o.First.Is4() && !r.Last.Less(o.First) && !o.Last.Less(r.First)
}

// LBClassState is what the allocation says of a class.
type LBClassState struct {
	Ready     bool
	Reason    string // of the Ready condition
	Message   string
	Allocated int
	// Excluded says which addresses of the pool are never handed out
	// (reserved ones, other Services' external IPs): "" when none.
	Excluded string
}

// LBServiceState is what the allocation decides for one Service it
// serves: its VIPs (one per family it asks for and its class provides, in
// the Service's family order) and, when something is wrong, an Event.
type LBServiceState struct {
	Class   string
	IPs     []netip.Addr
	Reason  string // "" when every family got its VIP
	Message string
}

// LBResult is the allocation of every Lace LoadBalancer Service.
type LBResult struct {
	Classes  map[string]LBClassState
	Services map[string]LBServiceState // by namespace/name; Services of other classes are absent
	// Release names the Services (namespace/name) that are no longer
	// LoadBalancers but still hold an address of a Lace pool.
	Release map[string]bool
}

type lbClass struct {
	name   string
	ranges []IPRange // the valid ones
	// ready: the pool is usable as written, so new VIPs come from it. A
	// class that is not keeps what it handed out (an edit, a newer
	// overlapping class or a second default never takes VIPs away).
	ready   bool
	problem string
	// Who may use the pool, and who may ask for a specific address in it
	// (selectors of namespaces; nil use: every namespace; nil request:
	// none).
	use, request       labels.Selector
	useErr, requestErr error
}

// admits says why the class refuses a Service of namespace ns ("" when it
// does not): the namespace is not one its namespaceSelector selects, or
// the Service asks for an address and addressRequestNamespaceSelector
// does not let it.
func (c *lbClass) admits(ns string, nsLabels map[string]string, asks bool) (reason, message string) {
	switch {
	case c.useErr != nil:
		return LBReasonNamespaceNotAllowed, fmt.Sprintf("LoadBalancerClass %s: namespaceSelector: %v", c.name, c.useErr)
	case c.use != nil && !c.use.Matches(labels.Set(nsLabels)):
		return LBReasonNamespaceNotAllowed, fmt.Sprintf("LoadBalancerClass %s does not serve namespace %s (its namespaceSelector): no address, any held is released", c.name, ns)
	case !asks:
		return "", ""
	case c.requestErr != nil:
		return LBReasonAddressRequestNotAllowed, fmt.Sprintf("LoadBalancerClass %s: addressRequestNamespaceSelector: %v", c.name, c.requestErr)
	case c.request == nil || !c.request.Matches(labels.Set(nsLabels)):
		return LBReasonAddressRequestNotAllowed, fmt.Sprintf("LoadBalancerClass %s does not let namespace %s ask for a specific address (its addressRequestNamespaceSelector): no address, any held is released", c.name, ns)
	}
	return "", ""
}

// AllocateLoadBalancers decides every Lace LoadBalancer Service's VIPs.
// What a Service holds (status.loadBalancer.ingress) is kept while it is
// valid (in its class's pool, of a family it asks for, not held by an older
// Service, matching what it requests), so a controller restart or another
// Service's change never moves a VIP; a new one is a free address found
// from a place in the pool the Service's UID gives (pickFree).
// Services are served oldest first, so two asking for one address resolve
// the same way every time. Addresses other implementations' Services hold
// are never handed out; their Services (another class, or none while Lace
// has no single default) are left alone.
//
// A class serves only the namespaces its namespaceSelector selects, and
// lets only those its addressRequestNamespaceSelector selects ask for a
// specific address (namespaces: namespace -> labels); a Service it refuses
// holds nothing, not even what it held.
//
// Addresses avoid says are never handed out (LBAvoid), and what of a pool
// they exclude is said on its class (LBClassState.Excluded).
func AllocateLoadBalancers(classes []lacev1.LoadBalancerClass, svcs []corev1.Service, namespaces map[string]map[string]string, avoid LBAvoid) LBResult {
	res := LBResult{Classes: map[string]LBClassState{}, Services: map[string]LBServiceState{}, Release: map[string]bool{}}
	byName := map[string]*lbClass{}
	var defaults []string
	sorted := slices.Clone(classes)
	// Oldest first: of two overlapping classes the newer is the one at
	// fault.
	slices.SortFunc(sorted, func(a, b lacev1.LoadBalancerClass) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	var earlier []*lbClass
	xips := externalIPClaims(svcs, avoid)
	for _, c := range sorted {
		st := LBClassState{Ready: true, Reason: LBReasonReady, Message: "the pool is usable"}
		lc := &lbClass{name: c.Name}
		if sel := c.Spec.NamespaceSelector; sel != nil {
			lc.use, lc.useErr = metav1.LabelSelectorAsSelector(sel)
		}
		if sel := c.Spec.AddressRequestNamespaceSelector; sel != nil {
			lc.request, lc.requestErr = metav1.LabelSelectorAsSelector(sel)
		}
		for _, a := range c.Spec.Addresses {
			r, err := ParseAddressRange(a)
			if err != nil {
				st = LBClassState{Reason: LBReasonInvalidRange, Message: err.Error()}
				continue
			}
			lc.ranges = append(lc.ranges, r)
		}
		if st.Ready {
			for _, o := range earlier {
				if other := overlapWith(lc.ranges, o); other != "" {
					st = LBClassState{Reason: LBReasonOverlap, Message: fmt.Sprintf("addresses overlap the older class %s's (%s)", o.name, other)}
					break
				}
			}
		}
		if c.Spec.Default {
			defaults = append(defaults, c.Name)
		}
		lc.ready, lc.problem = st.Ready, st.Message
		st.Excluded = excludedFrom(lc, avoid, xips)
		res.Classes[c.Name] = st
		byName[c.Name] = lc
		earlier = append(earlier, lc)
	}
	defaultClass := ""
	if len(defaults) == 1 {
		defaultClass = defaults[0]
	} else if len(defaults) > 1 {
		for _, d := range defaults {
			st := LBClassState{Reason: LBReasonMultipleDefaults, Message: "more than one class is the default: " + strings.Join(defaults, ", ")}
			if byName[d].ready {
				byName[d].ready, byName[d].problem = false, st.Message
				res.Classes[d] = st
			}
		}
	}

	order := make([]*corev1.Service, 0, len(svcs))
	held := map[netip.Addr]string{}
	for i := range svcs {
		s := &svcs[i]
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			for _, a := range IngressAddrs(s) {
				if slices.ContainsFunc(earlier, func(c *lbClass) bool { return inPool(c, a) }) {
					res.Release[s.Namespace+"/"+s.Name] = true
				}
			}
			continue
		}
		if className(s, defaultClass) == "" {
			// Another implementation's: what it holds is taken.
			for _, a := range IngressAddrs(s) {
				held[a] = s.Namespace + "/" + s.Name
			}
			continue
		}
		order = append(order, s)
	}
	slices.SortFunc(order, func(a, b *corev1.Service) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	type pending struct {
		key     string
		class   *lbClass
		name    string
		want    []corev1.IPFamily
		request map[bool]netip.Addr // by Is4
		got     map[bool]netip.Addr
		reason  string // set: keep what it holds, hand out nothing new
		message string
		refused bool // the class refuses the Service: it keeps nothing either
		svc     *corev1.Service
	}
	var todo []*pending
	for _, s := range order {
		name := className(s, defaultClass)
		p := &pending{key: s.Namespace + "/" + s.Name, class: byName[name], name: name, want: s.Spec.IPFamilies, svc: s,
			request: map[bool]netip.Addr{}, got: map[bool]netip.Addr{}}
		if len(p.want) == 0 {
			p.want = []corev1.IPFamily{corev1.IPv4Protocol}
		}
		switch {
		case p.class == nil:
			// Nobody checks a class that does not exist against the
			// Service's namespace: it holds nothing (else a Service could
			// keep an address through a made-up class forever).
			p.reason, p.refused = LBReasonNoClass, true
			p.message = fmt.Sprintf("LoadBalancerClass %s does not exist: no address, any held is released", name)
		case !p.class.ready:
			p.reason, p.message = LBReasonNoClass, fmt.Sprintf("LoadBalancerClass %s is not Ready (%s): no new addresses", name, p.class.problem)
		}
		if p.class != nil {
			if r, m := p.class.admits(s.Namespace, namespaces[s.Namespace], len(requested(s)) > 0); r != "" {
				p.reason, p.message, p.refused = r, m, true
			}
		}
		var bad []string
		for _, r := range requested(s) {
			a, err := netip.ParseAddr(r)
			switch {
			case err != nil || a.Zone() != "":
				// A zone (fe80::1%eth0) parses, and inside the pool's
				// range it would be handed out as the VIP, zone and all.
				bad = append(bad, r+" is not an IP address")
			case !wantsFamily(p.want, a.Unmap().Is4()):
				bad = append(bad, r+" is of a family the Service does not have")
			case p.request[a.Unmap().Is4()].IsValid():
				bad = append(bad, r+" is a second address of its family")
			default:
				p.request[a.Unmap().Is4()] = a.Unmap()
			}
		}
		if len(bad) > 0 && p.reason == "" && !p.refused {
			p.reason, p.message = LBReasonInvalidRequestedIP, "requested addresses: "+strings.Join(bad, "; ")
		}
		// What it holds and may keep: in its class's pool.
		for _, a := range IngressAddrs(s) {
			v4 := a.Is4()
			if p.refused {
				break
			}
			if !wantsFamily(p.want, v4) || held[a] != "" || p.got[v4].IsValid() || !inPool(p.class, a) ||
				reservedIn(a, avoid.Reserved) != "" {
				continue
			}
			if r, ok := p.request[v4]; ok && r != a {
				continue
			}
			p.got[v4], held[a] = a, p.key
		}
		todo = append(todo, p)
	}
	for _, p := range todo {
		if p.reason != "" {
			st := LBServiceState{Class: p.name, Reason: p.reason, Message: p.message}
			for _, fam := range p.want {
				if a := p.got[fam == corev1.IPv4Protocol]; a.IsValid() {
					st.IPs = append(st.IPs, a)
				}
			}
			res.Services[p.key] = st
			if cs, ok := res.Classes[p.name]; ok {
				cs.Allocated += len(st.IPs)
				res.Classes[p.name] = cs
			}
			continue
		}
		st := LBServiceState{Class: p.class.name}
		var problems []string
		for _, fam := range p.want {
			v4 := fam == corev1.IPv4Protocol
			if a := p.got[v4]; a.IsValid() {
				st.IPs = append(st.IPs, a)
				continue
			}
			if !poolHasFamily(p.class, v4) {
				st.Reason = LBReasonUnsupportedFamily
				problems = append(problems, fmt.Sprintf("class %s has no %s addresses", p.class.name, fam))
				continue
			}
			if r, ok := p.request[v4]; ok {
				switch {
				case !inPool(p.class, r):
					st.Reason = LBReasonAddressNotInPool
					problems = append(problems, fmt.Sprintf("%s is not in class %s's pool", r, p.class.name))
				case held[r] != "":
					st.Reason = LBReasonAddressConflict
					problems = append(problems, fmt.Sprintf("%s is held by %s", r, held[r]))
				case avoidProblem(r, p.key, avoid, xips) != "":
					st.Reason = LBReasonAddressConflict
					problems = append(problems, avoidProblem(r, p.key, avoid, xips))
				default:
					held[r] = p.key
					st.IPs = append(st.IPs, r)
				}
				continue
			}
			taken := func(a netip.Addr) bool { return held[a] != "" || xips[a] != "" && xips[a] != p.key }
			a, ok := pickFree(p.class, v4, allocSeed(p.svc, v4), avoid.Reserved, taken, len(held)+len(xips))
			if !ok {
				st.Reason = LBReasonPoolExhausted
				problems = append(problems, fmt.Sprintf("class %s has no free %s address", p.class.name, fam))
				continue
			}
			held[a] = p.key
			st.IPs = append(st.IPs, a)
		}
		st.Message = strings.Join(problems, "; ")
		res.Services[p.key] = st
		cs := res.Classes[p.class.name]
		cs.Allocated += len(st.IPs)
		res.Classes[p.class.name] = cs
	}
	return res
}

// className is the Lace class a LoadBalancer Service is served by, or ""
// when it is not Lace's (another class; none while Lace has no single
// default).
func className(s *corev1.Service, defaultClass string) string {
	switch {
	case s.Spec.LoadBalancerClass == nil:
		return defaultClass
	case strings.HasPrefix(*s.Spec.LoadBalancerClass, lacev1.LoadBalancerClassPrefix):
		return strings.TrimPrefix(*s.Spec.LoadBalancerClass, lacev1.LoadBalancerClassPrefix)
	}
	return ""
}

// IngressAddrs lists the addresses of a Service's status.loadBalancer.ingress
// (IPv4-mapped ones as IPv4).
func IngressAddrs(s *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

func overlapWith(rs []IPRange, o *lbClass) string {
	for _, r := range o.ranges {
		for _, mine := range rs {
			if mine.overlaps(r) {
				return fmt.Sprintf("%s-%s", r.First, r.Last)
			}
		}
	}
	return ""
}

// requested lists the addresses a Service asks for: the annotation, else
// spec.loadBalancerIP.
func requested(s *corev1.Service) []string {
	if v := strings.TrimSpace(s.Annotations[lacev1.AnnotationLoadBalancerIPs]); v != "" {
		var out []string
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
		return out
	}
	if s.Spec.LoadBalancerIP != "" {
		return []string{s.Spec.LoadBalancerIP}
	}
	return nil
}

func wantsFamily(want []corev1.IPFamily, v4 bool) bool {
	f := corev1.IPv6Protocol
	if v4 {
		f = corev1.IPv4Protocol
	}
	return slices.Contains(want, f)
}

func inPool(c *lbClass, a netip.Addr) bool {
	return slices.ContainsFunc(c.ranges, func(r IPRange) bool { return r.Contains(a) })
}

func poolHasFamily(c *lbClass, v4 bool) bool {
	return slices.ContainsFunc(c.ranges, func(r IPRange) bool { return r.First.Is4() == v4 })
}
