package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

func lbPool(name string, def bool, addrs ...string) lacev1.LoadBalancerClass {
	// Every namespace may ask for an address (the tests of requests).
	c := lacev1.LoadBalancerClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lacev1.LoadBalancerClassSpec{Default: def,
		AddressRequestNamespaceSelector: &metav1.LabelSelector{}}}
	for _, a := range addrs {
		c.Spec.Addresses = append(c.Spec.Addresses, lacev1.AddressRange(a))
	}
	return c
}

// lbSvc is a LoadBalancer Service created age seconds after the epoch
// (older first), asking for families, holding ips.
func lbSvc(name string, age int, class *string, families []corev1.IPFamily, ips ...string) corev1.Service {
	s := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
		CreationTimestamp: metav1.NewTime(time.Unix(int64(age), 0))},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: class, IPFamilies: families}}
	for _, ip := range ips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	return s
}

var (
	v4only = []corev1.IPFamily{corev1.IPv4Protocol}
	v6v4   = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
)

func ips(st LBServiceState) string { return fmt.Sprint(st.IPs) }

func TestParseAddressRange(t *testing.T) {
	for _, c := range []struct {
		in, first, last string
		bad             bool
	}{
		{in: "192.0.2.0/30", first: "192.0.2.1", last: "192.0.2.2"},
		{in: "192.0.2.8/31", first: "192.0.2.8", last: "192.0.2.9"},
		{in: "192.0.2.7/32", first: "192.0.2.7", last: "192.0.2.7"},
		{in: "2001:db8::/126", first: "2001:db8::1", last: "2001:db8::3"}, // no subnet-router anycast
		{in: "2001:db8::/127", first: "2001:db8::", last: "2001:db8::1"},
		{in: "::ffff:192.0.2.0/120", bad: true},
		{in: "192.0.2.10-192.0.2.20", first: "192.0.2.10", last: "192.0.2.20"},
		{in: "2001:db8::10-2001:db8::1", bad: true}, // IPv6 order: CEL cannot check it
		{in: "2001:db8::1-192.0.2.1", bad: true},
		{in: "192.0.2.1/24", bad: true},
		{in: "nonsense", bad: true},
	} {
		r, err := ParseAddressRange(lacev1.AddressRange(c.in))
		if c.bad {
			if err == nil {
				t.Errorf("%s: accepted as %v-%v", c.in, r.First, r.Last)
			}
			continue
		}
		if err != nil || r.First.String() != c.first || r.Last.String() != c.last {
			t.Errorf("%s: %v-%v %v, want %s-%s", c.in, r.First, r.Last, err, c.first, c.last)
		}
	}
}

func TestAllocateLoadBalancers(t *testing.T) {
	small := lbPool("small", true, "192.0.2.0/30")
	dual := lbPool("dual", false, "198.51.100.10-198.51.100.11", "2001:db8:1::/127")
	dualName := ptr.To("lace-cni.io/dual")

	// The lowest free address, oldest Service first; the pool runs out.
	res := AllocateLoadBalancers([]lacev1.LoadBalancerClass{small, dual}, []corev1.Service{
		lbSvc("c", 3, nil, v4only), lbSvc("a", 1, nil, v4only), lbSvc("b", 2, nil, v4only)}, nil, LBAvoid{})
	if ips(res.Services["ns/a"]) != "[192.0.2.1]" || ips(res.Services["ns/b"]) != "[192.0.2.2]" {
		t.Errorf("a %v, b %v: want .1 and .2, oldest first", res.Services["ns/a"], res.Services["ns/b"])
	}
	if c := res.Services["ns/c"]; len(c.IPs) != 0 || c.Reason != LBReasonPoolExhausted {
		t.Errorf("c: %+v, want PoolExhausted", c)
	}
	if got := res.Classes["small"]; !got.Ready || got.Allocated != 2 {
		t.Errorf("class small: %+v, want Ready with 2 allocated", got)
	}

	// What a Service holds stays, whoever came first (a restart, a change
	// elsewhere); a newer one gets what is free.
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{small}, []corev1.Service{
		lbSvc("a", 1, nil, v4only), lbSvc("b", 2, nil, v4only, "192.0.2.2")}, nil, LBAvoid{})
	if ips(res.Services["ns/a"]) != "[192.0.2.1]" || ips(res.Services["ns/b"]) != "[192.0.2.2]" {
		t.Errorf("held address moved: a %v, b %v", res.Services["ns/a"], res.Services["ns/b"])
	}
	// Two holding one address: the older keeps it, the newer moves.
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{small}, []corev1.Service{
		lbSvc("b", 2, nil, v4only, "192.0.2.1"), lbSvc("a", 1, nil, v4only, "192.0.2.1")}, nil, LBAvoid{})
	if ips(res.Services["ns/a"]) != "[192.0.2.1]" || ips(res.Services["ns/b"]) != "[192.0.2.2]" {
		t.Errorf("one address held twice: a %v, b %v, want the older keeping it", res.Services["ns/a"], res.Services["ns/b"])
	}

	// Families: one VIP per family asked for and offered, in the Service's
	// order; a family the class lacks is reported.
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{small, dual}, []corev1.Service{
		lbSvc("d", 1, dualName, v6v4), lbSvc("e", 2, nil, v6v4)}, nil, LBAvoid{})
	if ips(res.Services["ns/d"]) != "[2001:db8:1:: 198.51.100.10]" || res.Services["ns/d"].Reason != "" {
		t.Errorf("dual-stack Service in a dual-stack class: %+v", res.Services["ns/d"])
	}
	if e := res.Services["ns/e"]; ips(e) != "[192.0.2.1]" || e.Reason != LBReasonUnsupportedFamily {
		t.Errorf("dual-stack Service in an IPv4 class: %+v, want its IPv4 VIP and UnsupportedFamily", e)
	}

	// Requested addresses: the annotation or spec.loadBalancerIP; the older
	// request wins a conflict; outside the pool is reported.
	f := lbSvc("f", 1, dualName, v4only)
	f.Annotations = map[string]string{lacev1.AnnotationLoadBalancerIPs: "198.51.100.11"}
	g := lbSvc("g", 2, dualName, v4only)
	g.Spec.LoadBalancerIP = "198.51.100.11"
	h := lbSvc("h", 3, dualName, v4only)
	h.Spec.LoadBalancerIP = "203.0.113.1"
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{small, dual}, []corev1.Service{h, g, f}, nil, LBAvoid{})
	if ips(res.Services["ns/f"]) != "[198.51.100.11]" {
		t.Errorf("requested by annotation: %+v", res.Services["ns/f"])
	}
	if g := res.Services["ns/g"]; len(g.IPs) != 0 || g.Reason != LBReasonAddressConflict {
		t.Errorf("requested and held by an older Service: %+v, want AddressConflict", g)
	}
	if h := res.Services["ns/h"]; len(h.IPs) != 0 || h.Reason != LBReasonAddressNotInPool {
		t.Errorf("requested outside the pool: %+v, want AddressNotInPool", h)
	}

	// Classes: another implementation's Services are left alone; no usable
	// default; two defaults; overlapping and invalid pools.
	other := lbSvc("o", 1, ptr.To("example.com/lb"), v4only)
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{small, lbPool("small2", true, "203.0.113.0/24")},
		[]corev1.Service{other, lbSvc("p", 2, nil, v4only)}, nil, LBAvoid{})
	if _, ok := res.Services["ns/o"]; ok {
		t.Errorf("a Service of another class was handled: %+v", res.Services["ns/o"])
	}
	if p, ok := res.Services["ns/p"]; ok {
		t.Errorf("two default classes: a Service naming none was handled (%+v); it is left alone", p)
	}
	for _, c := range []string{"small", "small2"} {
		if res.Classes[c].Reason != LBReasonMultipleDefaults {
			t.Errorf("class %s: %+v, want MultipleDefaults", c, res.Classes[c])
		}
	}
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{lbPool("x", false, "192.0.2.0/29"), lbPool("y", false, "192.0.2.4-192.0.2.9"),
		lbPool("z", false, "2001:db8::9-2001:db8::1")}, nil, nil, LBAvoid{})
	for c, want := range map[string]string{"x": LBReasonReady, "y": LBReasonOverlap, "z": LBReasonInvalidRange} {
		if got := res.Classes[c]; got.Ready != (want == LBReasonReady) || got.Reason != want {
			t.Errorf("class %s: %+v, want %s (the older of two overlapping classes stays)", c, got, want)
		}
	}

	// Addresses another implementation's Services hold are never handed
	// out; nor are Services naming no class touched without a Lace
	// default.
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{lbPool("nodef", false, "192.0.2.0/30")}, []corev1.Service{
		lbSvc("metallb", 1, nil, v4only, "192.0.2.1"), lbSvc("mine", 2, ptr.To("lace-cni.io/nodef"), v4only)}, nil, LBAvoid{})
	if _, ok := res.Services["ns/metallb"]; ok || ips(res.Services["ns/mine"]) != "[192.0.2.2]" {
		t.Errorf("beside another implementation's Service: %+v", res.Services)
	}

	// A class that stops being Ready (a second default, a bad edit) keeps
	// what it handed out and hands out nothing new.
	broken := lbPool("small", true, "192.0.2.0/30", "2001:db8::9-2001:db8::1")
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{broken}, []corev1.Service{
		lbSvc("a", 1, nil, v4only, "192.0.2.2"), lbSvc("b", 2, nil, v4only)}, nil, LBAvoid{})
	if a := res.Services["ns/a"]; ips(a) != "[192.0.2.2]" || a.Reason != LBReasonNoClass {
		t.Errorf("held address in a class gone bad: %+v, want kept with a report", a)
	}
	if b := res.Services["ns/b"]; len(b.IPs) != 0 || b.Reason != LBReasonNoClass {
		t.Errorf("new Service in a class gone bad: %+v, want nothing and a report", b)
	}

	// Requests that cannot be honoured are reported.
	two := lbSvc("two", 1, nil, v4only)
	two.Annotations = map[string]string{lacev1.AnnotationLoadBalancerIPs: "192.0.2.1,192.0.2.2"}
	fam := lbSvc("fam", 2, nil, v4only)
	fam.Spec.LoadBalancerIP = "2001:db8::5"
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{small}, []corev1.Service{two, fam}, nil, LBAvoid{})
	for _, k := range []string{"ns/two", "ns/fam"} {
		if st := res.Services[k]; st.Reason != LBReasonInvalidRequestedIP || len(st.IPs) != 0 {
			t.Errorf("%s: %+v, want InvalidRequestedIP", k, st)
		}
	}

	// Not a LoadBalancer (any more): nothing allocated.
	np := lbSvc("n", 1, nil, v4only, "192.0.2.1")
	np.Spec.Type = corev1.ServiceTypeNodePort
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{small}, []corev1.Service{np}, nil, LBAvoid{})
	if _, ok := res.Services["ns/n"]; ok || res.Classes["small"].Allocated != 0 || !res.Release["ns/n"] {
		t.Errorf("a NodePort Service holds a VIP: %+v, want it released", res)
	}
}

// TestAllocateLoadBalancersNeverTwice: over random Services, requests and
// held addresses, no address goes to two Services, every one is in its
// class's pool and of a family the Service asks for, and a second pass
// over the result changes nothing (stable across restarts).
func TestAllocateLoadBalancersNeverTwice(t *testing.T) {
	classes := []lacev1.LoadBalancerClass{lbPool("a", true, "192.0.2.0/28", "2001:db8::/124"), lbPool("b", false, "198.51.100.0-198.51.100.3")}
	// A node address and a slice of a pod subnet inside the pools, and an
	// allow-list under which some Services name pool addresses.
	avoid := LBAvoid{Reserved: []netip.Prefix{netip.MustParsePrefix("192.0.2.6/32"), netip.MustParsePrefix("2001:db8::8/126")},
		AllowedExternalIPs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	for seed := range 200 {
		var svcs []corev1.Service
		for i := range 8 + seed%13 {
			var class *string
			if (seed+i)%3 == 0 {
				class = ptr.To("lace-cni.io/b")
			}
			fam := [][]corev1.IPFamily{v4only, v6v4, {corev1.IPv6Protocol}}[(seed*7+i)%3]
			s := lbSvc(fmt.Sprint("s", i), (seed*31+i*17)%50, class, fam)
			s.UID = types.UID(fmt.Sprintf("uid-%d-%d", seed, i))
			if i%5 == 4 {
				s.Spec.ExternalIPs = []string{fmt.Sprintf("192.0.2.%d", (seed+i)%16)}
			}
			switch (seed + i*5) % 4 {
			case 0:
				s.Spec.LoadBalancerIP = fmt.Sprintf("192.0.2.%d", (seed+i)%16)
			case 1:
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("198.51.100.%d", (seed+i)%5)}}
			}
			svcs = append(svcs, s)
		}
		res := AllocateLoadBalancers(classes, svcs, nil, avoid)
		xips := externalIPClaims(svcs, avoid)
		seen := map[netip.Addr]string{}
		for i := range svcs {
			key := "ns/" + svcs[i].Name
			st := res.Services[key]
			for _, a := range st.IPs {
				if o := seen[a]; o != "" {
					t.Fatalf("seed %d: %s given to %s and %s", seed, a, o, key)
				}
				seen[a] = key
				if !wantsFamily(svcs[i].Spec.IPFamilies, a.Is4()) {
					t.Fatalf("seed %d: %s got %s, a family it did not ask for", seed, key, a)
				}
				if reservedIn(a, avoid.Reserved) != "" {
					t.Fatalf("seed %d: %s got the reserved %s", seed, key, a)
				}
				if o := xips[a]; o != "" && o != key && !slices.Contains(IngressAddrs(&svcs[i]), a) {
					t.Fatalf("seed %d: %s was handed %s, an external IP of %s", seed, key, a, o)
				}
			}
			svcs[i].Status.LoadBalancer.Ingress = nil
			for _, a := range st.IPs {
				svcs[i].Status.LoadBalancer.Ingress = append(svcs[i].Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: a.String()})
			}
		}
		again := AllocateLoadBalancers(classes, svcs, nil, avoid)
		for k, st := range res.Services {
			if !slices.Equal(again.Services[k].IPs, st.IPs) {
				t.Fatalf("seed %d: %s moved from %v to %v on a second pass", seed, k, st.IPs, again.Services[k].IPs)
			}
		}
	}
}

// TestLoadBalancerClassNamespaces: a class serves only the namespaces its
// namespaceSelector selects and lets only those its
// addressRequestNamespaceSelector selects ask for an address (unset: no
// one); a refused Service holds nothing, not even the address it held,
// which another Service then gets.
func TestLoadBalancerClassNamespaces(t *testing.T) {
	c := lbPool("pool", true, "192.0.2.0/29")
	c.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"lb": "yes"}}
	c.Spec.AddressRequestNamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"lb-request": "yes"}}
	nss := map[string]map[string]string{"ns": {"lb": "yes", "lb-request": "yes"}, "plain": {"lb": "yes"}, "other": nil}
	in := func(ns string, s corev1.Service) corev1.Service { s.Namespace = ns; return s }
	ask := func(s corev1.Service, ip string) corev1.Service { s.Spec.LoadBalancerIP = ip; return s }
	v4 := []corev1.IPFamily{corev1.IPv4Protocol}
	svcs := []corev1.Service{
		in("other", lbSvc("squatter", 1, nil, v4, "192.0.2.1")), // held before the selector: released
		in("plain", lbSvc("plain", 2, nil, v4)),
		in("plain", ask(lbSvc("plain-asks", 3, nil, v4), "192.0.2.5")),
		ask(lbSvc("asks", 4, nil, v4), "192.0.2.6"),
	}
	res := AllocateLoadBalancers([]lacev1.LoadBalancerClass{c}, svcs, nss, LBAvoid{})
	for key, want := range map[string]struct{ ips, reason string }{
		"other/squatter":   {"", LBReasonNamespaceNotAllowed},
		"plain/plain":      {"192.0.2.1", ""},
		"plain/plain-asks": {"", LBReasonAddressRequestNotAllowed},
		"ns/asks":          {"192.0.2.6", ""},
	} {
		st := res.Services[key]
		if got := joinAddrsForTest(st.IPs); got != want.ips || st.Reason != want.reason {
			t.Errorf("%s: %q %s (%s), want %q %s", key, got, st.Reason, st.Message, want.ips, want.reason)
		}
	}
	// Unset addressRequestNamespaceSelector: nobody may ask.
	c.Spec.AddressRequestNamespaceSelector = nil
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{c}, svcs, nss, LBAvoid{})
	if st := res.Services["ns/asks"]; st.Reason != LBReasonAddressRequestNotAllowed || len(st.IPs) != 0 {
		t.Errorf("unset request selector: ns/asks got %+v", st)
	}
	// An invalid selector refuses everyone, with the parse error.
	c.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "lb", Operator: "Bogus"}}}
	res = AllocateLoadBalancers([]lacev1.LoadBalancerClass{c}, svcs, nss, LBAvoid{})
	if st := res.Services["plain/plain"]; st.Reason != LBReasonNamespaceNotAllowed || !strings.Contains(st.Message, "namespaceSelector") {
		t.Errorf("invalid selector: %+v", st)
	}
}

func joinAddrsForTest(as []netip.Addr) string {
	var out []string
	for _, a := range as {
		out = append(out, a.String())
	}
	return strings.Join(out, ",")
}
