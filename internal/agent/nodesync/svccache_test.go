package nodesync

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
)

// TestServiceCacheMatchesComputeServices: over random changes of Services,
// EndpointSlices, NetworkEndpoints, binding policies, namespace labels and
// the node's zone, the incremental computation gives exactly what
// model.ComputeServices gives for the objects at that point, and the VIPs
// of model.BoundServiceVIPs; unchanged objects are not computed again.
func TestServiceCacheMatchesComputeServices(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	rv := 0
	bump := func(m *metav1.ObjectMeta) { rv++; m.ResourceVersion = strconv.Itoa(rv) }
	nets := []lacev1.Network{
		{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Status: lacev1.NetworkStatus{ID: 1}},
		{ObjectMeta: metav1.ObjectMeta{Name: "red"}, Status: lacev1.NetworkStatus{ID: 2}},
		{ObjectMeta: metav1.ObjectMeta{Name: "blue"}},
	}
	nbps := []lacev1.NetworkBindingPolicy{
		{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: lacev1.NetworkBindingPolicySpec{Network: "default", Priority: model.CatchAllPriority}},
		{ObjectMeta: metav1.ObjectMeta{Name: "red"}, Spec: lacev1.NetworkBindingPolicySpec{Network: "red", Priority: 10,
			MatchKind: lacev1.MatchKindService, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"net": "red"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "team"}, Spec: lacev1.NetworkBindingPolicySpec{Network: "blue", Priority: 20,
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}},
	}
	nss := []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, {ObjectMeta: metav1.ObjectMeta{Name: "b"}}}
	for i := range nets {
		bump(&nets[i].ObjectMeta)
	}
	for i := range nbps {
		bump(&nbps[i].ObjectMeta)
	}
	for i := range nss {
		bump(&nss[i].ObjectMeta)
	}
	addr := func() string { return fmt.Sprintf("10.%d.0.%d", 1+rng.Intn(2), rng.Intn(12)) }
	var neps []lacev1.NetworkEndpoint
	newNE := func(i int) lacev1.NetworkEndpoint {
		ne := lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: fmt.Sprintf("p%d", i),
			Labels: map[string]string{"lace-cni.io/pod-uid": fmt.Sprintf("u%d", i)}},
			Spec: lacev1.NetworkEndpointSpec{Network: []string{"default", "red"}[rng.Intn(2)], Addresses: []lacev1.IPAddress{lacev1.IPAddress(addr())}}}
		bump(&ne.ObjectMeta)
		return ne
	}
	for i := range 6 {
		neps = append(neps, newNE(i))
	}
	// The cache keeps the informer's objects, which are replaced, never
	// modified: a changed one is a new pointer.
	nePtrs := make([]*lacev1.NetworkEndpoint, len(neps))
	for i := range neps {
		nePtrs[i] = ptr.To(neps[i])
	}
	newSvc := func(ns, name string) corev1.Service {
		s := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + name + strconv.Itoa(rv))},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP,
				Ports: []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}}}}
		vip := fmt.Sprintf("10.96.%d.%d", rng.Intn(4), rng.Intn(200))
		s.Spec.ClusterIP, s.Spec.ClusterIPs = vip, []string{vip}
		switch rng.Intn(9) {
		case 6:
			s.Spec.Type = corev1.ServiceTypeNodePort
			for i := range s.Spec.Ports {
				s.Spec.Ports[i].NodePort = int32(30000 + rng.Intn(8))
			}
		case 7:
			// A Local load balancer: a health check, an address
			// another Service's external IP may name.
			s.Spec.Type, s.Spec.ExternalTrafficPolicy = corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = int32(32000 + rng.Intn(4))
			for i := range s.Spec.Ports {
				s.Spec.Ports[i].NodePort = int32(30100 + rng.Intn(8))
			}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("192.0.2.%d", rng.Intn(4))}}
		case 8:
			// Another port than the others' at the address: owned (and
			// served) or not by who else claims it.
			s.Spec.ExternalIPs = []string{fmt.Sprintf("192.0.2.%d", rng.Intn(4))}
			s.Spec.Ports[0].Port = 8080
		case 0:
			s.Labels = map[string]string{"net": "red"}
		case 1:
			s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, nil
		case 2:
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		case 3:
			s.Annotations = map[string]string{lacev1.AnnotationTrafficDistribution: model.TrafficDistributionPreferClosest}
		}
		bump(&s.ObjectMeta)
		return s
	}
	newSlice := func(ns, svc, name string) discoveryv1.EndpointSlice {
		sl := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			UID: types.UID(ns + name + strconv.Itoa(rv)), Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)},
				{Name: ptr.To("dns"), Port: ptr.To[int32](5353), Protocol: ptr.To(corev1.ProtocolUDP)}}}
		for range rng.Intn(5) {
			e := discoveryv1.Endpoint{Addresses: []string{addr()}, NodeName: ptr.To([]string{"n1", "n2"}[rng.Intn(2)]),
				Zone: ptr.To([]string{"z1", "z2"}[rng.Intn(2)]),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(rng.Intn(4) > 0), Serving: ptr.To(true),
					Terminating: ptr.To(rng.Intn(3) == 0)}}
			if rng.Intn(3) == 0 {
				e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}}
			}
			if rng.Intn(3) == 0 {
				i := rng.Intn(8)
				e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "a", Name: fmt.Sprintf("p%d", i), UID: types.UID(fmt.Sprintf("u%d", i))}
			}
			sl.Endpoints = append(sl.Endpoints, e)
		}
		bump(&sl.ObjectMeta)
		return sl
	}
	var svcs []corev1.Service
	var sls []discoveryv1.EndpointSlice
	for i := range 30 {
		ns, name := []string{"a", "b"}[i%2], fmt.Sprintf("s%d", i)
		svcs = append(svcs, newSvc(ns, name))
		for j := range rng.Intn(3) {
			sls = append(sls, newSlice(ns, name, fmt.Sprintf("%s-%d", name, j)))
		}
	}

	// As the agent has it: entries replaced in place.
	c := serviceCache{inPlace: true}
	// A budget that refuses some of them: the patched cache against one
	// that judges and merges everything each round.
	budget := model.Budget{NamespaceFrontends: 40, TotalFrontends: 60}
	cb, cw := serviceCache{inPlace: true, budget: budget}, serviceCache{budget: budget, whole: true}
	var lastListB []datapath.Service
	var lastGenB uint64
	refusedRounds, patchedRefused := 0, 0
	var vNets, vNbps, vNss versions
	zone, lastZone := "z1", ""
	computed, patched := 0, 0
	var lastGen uint64
	var lastList, applied []datapath.Service
	var appliedGen uint64
	for round := range 300 {
		if round > 0 {
			switch rng.Intn(13) {
			case 12:
				// An endpoint replaced: the service's cost stays. Half
				// of them of a Service the budget refuses.
				i := rng.Intn(len(sls))
				if rng.Intn(2) == 0 {
					for j := range sls {
						k := model.ServiceKey{Namespace: sls[j].Namespace, Name: sls[j].Labels[discoveryv1.LabelServiceName]}
						if _, ok := cb.refused[k]; ok && len(sls[j].Endpoints) > 0 {
							i = j
						}
					}
				}
				if len(sls[i].Endpoints) > 0 {
					sls[i].Endpoints = slices.Clone(sls[i].Endpoints)
					sls[i].Endpoints[0].Addresses = []string{addr()}
					bump(&sls[i].ObjectMeta)
				}
			case 0, 1, 2:
				i := rng.Intn(len(sls))
				sls[i] = newSlice(sls[i].Namespace, sls[i].Labels[discoveryv1.LabelServiceName], sls[i].Name)
			case 3:
				i := rng.Intn(len(svcs))
				svcs[i] = newSvc(svcs[i].Namespace, svcs[i].Name)
			case 4:
				i := rng.Intn(len(svcs))
				svcs = slices.Delete(svcs, i, i+1)
			case 5:
				i := rng.Intn(40)
				ns, name := []string{"a", "b"}[i%2], fmt.Sprintf("s%d", i)
				if !slices.ContainsFunc(svcs, func(s corev1.Service) bool { return s.Namespace == ns && s.Name == name }) {
					svcs = append(svcs, newSvc(ns, name))
				}
				sls = append(sls, newSlice(ns, name, fmt.Sprintf("%s-x%d", name, round)))
			case 6:
				if len(sls) > 1 {
					i := rng.Intn(len(sls))
					sls = slices.Delete(sls, i, i+1)
				}
			case 7:
				i := rng.Intn(len(neps))
				neps[i] = newNE(i)
				nePtrs[i] = ptr.To(neps[i])
			case 8:
				zone = []string{"z1", "z2"}[rng.Intn(2)]
			case 9:
				nss[1].Labels = map[string]string{"team": []string{"blue", "red"}[rng.Intn(2)]}
				bump(&nss[1].ObjectMeta)
			case 10:
				nets[2].Status.ID = int32(rng.Intn(2) * 3)
				bump(&nets[2].ObjectMeta)
			case 11:
				nbps[1].Spec.Priority = int32(5 + rng.Intn(20))
				bump(&nbps[1].ObjectMeta)
			}
		}
		nsLabels := map[string]map[string]string{}
		for _, ns := range nss {
			nsLabels[ns.Name] = ns.Labels
		}
		shared := model.ServiceInput{Node: "n1", Zone: zone, Networks: nets, BindingPolicies: nbps, Namespaces: nsLabels,
			NodeAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.100")}, AllowedExternalIPs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
		c1 := vNets.update(len(nets), func(i int) client.Object { return &nets[i] })
		c2 := vNbps.update(len(nbps), func(i int) client.Object { return &nbps[i] })
		c4 := vNss.update(len(nss), func(i int) client.Object { return &nss[i] })
		zoneChanged := round == 0 || zone != lastZone
		lastZone = zone
		gens := map[model.ServiceKey]*svcEntry{}
		for k, e := range c.entries {
			gens[k] = e
		}
		// The informer lists in any order, objects it replaces and never
		// modifies (the cache keeps them).
		svcPtrs, slicePtrs := ptrs(slices.Clone(svcs)), ptrs(slices.Clone(sls))
		rng.Shuffle(len(svcPtrs), func(i, j int) { svcPtrs[i], svcPtrs[j] = svcPtrs[j], svcPtrs[i] })
		rng.Shuffle(len(slicePtrs), func(i, j int) { slicePtrs[i], slicePtrs[j] = slicePtrs[j], slicePtrs[i] })
		sharedChanged := c1 || c2 || c4 || zoneChanged
		nes := slices.Clone(nePtrs)
		rng.Shuffle(len(nes), func(i, j int) { nes[i], nes[j] = nes[j], nes[i] })
		c.indexPods(c.podChanges(nes))
		st, vips, _ := c.updateLists(shared, sharedChanged, svcPtrs, slicePtrs)
		for _, x := range []*serviceCache{&cb, &cw} {
			x.indexPods(x.podChanges(nes))
		}
		stB, vipsB, _ := cb.updateLists(shared, sharedChanged, svcPtrs, slicePtrs)
		stW, vipsW, _ := cw.updateLists(shared, sharedChanged, svcPtrs, slicePtrs)
		if len(cb.refused) > 0 {
			refusedRounds++
			if n := len(stB.Changes.Log); n > 0 && stB.Changes.Gen != lastGenB {
				patchedRefused++
			}
		}
		if keys, ok := stB.Changes.Since(lastGenB); ok {
			if bad := unnamedChanges(lastListB, stB.Services, keys); len(bad) > 0 {
				t.Fatalf("round %d, budget: frontends %v changed, not named by the step (%v)", round, bad, keys)
			}
		}
		lastListB, lastGenB = slices.Clone(stB.Services), stB.Changes.Gen
		stB.Changes, stW.Changes = model.ServiceChanges{}, model.ServiceChanges{}
		// The same refused; their messages' sums may differ, as a
		// verdict that stands is not judged again.
		sameRefused := maps.EqualFunc(cb.refused, cw.refused, func(a, b model.Refusal) bool { return a.Reason == b.Reason })
		for _, st := range []*model.ServiceState{&stB, &stW} {
			st.Bound = slices.Clone(st.Bound)
			for i := range st.Bound {
				if _, ok := cb.refused[model.ServiceKey{Namespace: st.Bound[i].Namespace, Name: st.Bound[i].Name}]; ok {
					st.Bound[i].Err = "refused"
				}
			}
		}
		if !sameRefused || !reflect.DeepEqual(stB, stW) || !reflect.DeepEqual(vipsB, vipsW) {
			t.Fatalf("round %d, budget: refused %v, state %+v, VIPs %v; judged and merged whole: refused %v, state %+v, VIPs %v",
				round, cb.refused, stB, vipsB, cw.refused, stW, vipsW)
		}
		for k, e := range c.entries {
			if gens[k] != e {
				computed++
			}
		}

		full := shared
		full.Services, full.EndpointSlices, full.NetworkEndpoints = svcs, sls, neps
		want := model.ComputeServices(full)
		if st.Changes.Gen == 0 || len(st.Changes.Log) > 0 && st.Changes.Log[len(st.Changes.Log)-1].Base == st.Changes.Gen {
			t.Fatalf("round %d: changes %+v: not a new merge's", round, st.Changes)
		}
		if n := len(st.Changes.Log); n > 0 && st.Changes.Gen != lastGen {
			patched++
		}
		// A step names every frontend it changed.
		if keys, ok := st.Changes.Since(lastGen); ok {
			if bad := unnamedChanges(lastList, st.Services, keys); len(bad) > 0 {
				t.Fatalf("round %d: frontends %v changed, not named by the step from %d to %d (%v)", round, bad, lastGen, st.Changes.Gen, keys)
			}
		}
		lastList = slices.Clone(st.Services)
		// An applier that falls behind (it takes one state in three, at
		// random) and applies as the table does: the keys since the
		// merge it applied last, or everything, ends with the list.
		if rng.Intn(3) == 0 || round == 299 {
			if keys, ok := st.Changes.Since(appliedGen); ok {
				applied = applyKeys(applied, st.Services, keys)
			} else {
				applied = slices.Clone(st.Services)
			}
			appliedGen = st.Changes.Gen
			if bad := unnamedChanges(applied, st.Services, nil); len(bad) > 0 {
				t.Fatalf("round %d: the lagging applier's list differs at %v", round, bad)
			}
		}
		lastGen = st.Changes.Gen
		st.Changes = model.ServiceChanges{}
		if !reflect.DeepEqual(st, want) {
			t.Fatalf("round %d: incremental state differs:\n got %+v\nwant %+v", round, st, want)
		}
		sorted := slices.Clone(svcs)
		slices.SortFunc(sorted, func(a, b corev1.Service) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
		})
		if wantVIPs := model.BoundServiceVIPs(sorted, want.Bound); !reflect.DeepEqual(vips, wantVIPs) {
			t.Fatalf("round %d: VIPs\n got %+v\nwant %+v", round, vips, wantVIPs)
		}
	}
	// Most rounds change one object: far fewer computations than a full
	// recomputation each round.
	if computed > 300*30/3 {
		t.Errorf("%d services computed over 300 rounds of ~30 services", computed)
	}
	// Most changes of one service are a patch of the last merge.
	if patched < 50 {
		t.Errorf("%d of 300 merges were patches", patched)
	}
	// While a Service is refused, a change elsewhere is still a patch.
	if refusedRounds < 60 || patchedRefused < 10 {
		t.Errorf("the budget refused in %d rounds, %d of them patched", refusedRounds, patchedRefused)
	}
	// A change that keeps every touched Service's cost leaves the
	// verdict standing, with no pass over every Service.
	if cb.judged > refusedRounds*3/4 {
		t.Errorf("the budget judged every Service %d times in %d rounds with a refusal", cb.judged, refusedRounds)
	}
	t.Logf("%d services computed, %d of 300 merges patched; with the budget %d rounds refused, %d of them patched, %d judged all",
		computed, patched, refusedRounds, patchedRefused, cb.judged)
}

// defaultNetworkInput is what every service shares on node n1 of a cluster
// with one network, "default", which binds every service.
func defaultNetworkInput() model.ServiceInput {
	return model.ServiceInput{Node: "n1", Networks: []lacev1.Network{{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Status: lacev1.NetworkStatus{ID: 1}}}, BindingPolicies: []lacev1.NetworkBindingPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: lacev1.NetworkBindingPolicySpec{Network: "default", Priority: model.CatchAllPriority}}}}
}

// BenchmarkServiceCacheOneChange: one EndpointSlice of 10,000 services
// changes between two updates (the services bench's endpoint change).
func BenchmarkServiceCacheOneChange(b *testing.B) {
	const n = 10000
	shared := defaultNetworkInput()
	svcs := make([]corev1.Service, n)
	sls := make([]discoveryv1.EndpointSlice, n)
	// ClusterIPs are given at random: not in the services' name order.
	perm := rand.New(rand.NewSource(7)).Perm(n)
	for i := range n {
		name := fmt.Sprintf("s%05d", i)
		vip := fmt.Sprintf("10.96.%d.%d", perm[i]>>8, perm[i]&255)
		svcs[i] = corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, ResourceVersion: "1"},
			Spec: corev1.ServiceSpec{ClusterIP: vip, ClusterIPs: []string{vip}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		sl := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, ResourceVersion: "1",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}}
		for j := range 10 {
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 160+i>>12, i>>4&255, (i&15)*10+j)}})
		}
		sls[i] = sl
	}
	c := serviceCache{inPlace: true} // as the agent has it
	sp, slp := ptrs(svcs), ptrs(sls)
	c.updateLists(shared, true, sp, slp)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		k := i % n
		sl := *slp[k]
		sl.ResourceVersion = strconv.Itoa(i + 2)
		sl.Endpoints = slices.Clone(sl.Endpoints)
		sl.Endpoints[0].Addresses = []string{fmt.Sprintf("10.200.%d.%d", i>>8&255, i&255)}
		slp[k] = &sl
		// As the informer's event gives it.
		c.mirror.mu.Lock()
		c.mirror.setSlice(types.NamespacedName{Namespace: sl.Namespace, Name: sl.Name}, &sl, true)
		c.mirror.mu.Unlock()
		if st, _, _ := c.update(shared, false); len(st.Services) != n {
			b.Fatal(len(st.Services))
		}
	}
}

// updateLists is update for full lists of the Services and EndpointSlices
// (a test's), through the cache's mirror.
func (c *serviceCache) updateLists(shared model.ServiceInput, sharedChanged bool, svcs []*corev1.Service,
	sls []*discoveryv1.EndpointSlice) (model.ServiceState, []model.ServiceVIPs, bool) {
	if c.mirror == nil {
		c.mirror = &svcMirror{}
	}
	c.mirror.resync(svcs, sls)
	return c.update(shared, sharedChanged)
}
