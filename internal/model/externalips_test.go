package model

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lace-cni/lace/internal/tables"
)

var xipEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// born makes a Service created sec seconds after the epoch, with uid.
func born(sec int, uid string) svcOpt {
	return func(s *corev1.Service) {
		s.CreationTimestamp = metav1.NewTime(xipEpoch.Add(time.Duration(sec) * time.Second))
		s.UID = types.UID(uid)
	}
}

func xips(a ...string) svcOpt { return func(s *corev1.Service) { s.Spec.ExternalIPs = a } }

func externalEntries(st ServiceState) []string {
	var out []string
	for _, s := range st.Services {
		if s.Frontend == tables.FrontendExternalIP {
			out = append(out, fmt.Sprintf("%s:%d via %s", s.VIP, s.Port, s.ClusterIP))
		}
	}
	return out
}

// TestExternalIPsAllowList: with no allow-list every external IP is
// refused (the API server's address, an outside resolver, anything); an
// allowed one is served; a reserved one never, even inside the allow-list;
// the refusals say why.
func TestExternalIPsAllowList(t *testing.T) {
	in := svInput()
	in.Reserved = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("172.30.0.11/32")}
	in.Services = []corev1.Service{svService("hostile", "10.96.0.40", svHTTP,
		xips("172.30.0.1", "8.8.8.8", "172.30.0.200", "172.30.0.11", "203.0.113.7", "fd00::1", "bogus"))}
	if got := externalEntries(ComputeServices(in)); len(got) != 0 {
		t.Errorf("no allow-list: served %v", got)
	}
	env := NewServiceEnv(in)
	r := env.Compute(&in.Services[0], nil)
	var reasons []string
	for _, x := range r.RefusedExternalIPs {
		reasons = append(reasons, x.Addr+"="+x.Reason)
	}
	want := []string{"172.30.0.1=ExternalIPNotAllowed", "8.8.8.8=ExternalIPNotAllowed", "172.30.0.200=ExternalIPNotAllowed",
		"172.30.0.11=ExternalIPReserved", "203.0.113.7=ExternalIPNotAllowed", "fd00::1=ExternalIPInvalid", "bogus=ExternalIPInvalid"}
	if !slices.Equal(reasons, want) {
		t.Errorf("refusals %v, want %v", reasons, want)
	}

	in.AllowedExternalIPs = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("172.30.0.0/24")}
	got := externalEntries(ComputeServices(in))
	want = []string{"172.30.0.1:80 via 10.96.0.40", "172.30.0.200:80 via 10.96.0.40", "203.0.113.7:80 via 10.96.0.40"}
	if !slices.Equal(got, want) {
		t.Errorf("allow-list: served %v, want %v (never the reserved node address)", got, want)
	}
}

// TestExternalIPContestOldestWins: of two Services naming one allowed
// address, the older keeps it whatever their names; same creation second:
// the lower UID. A load balancer address beats an external IP whatever
// the ages.
func TestExternalIPContestOldestWins(t *testing.T) {
	in := svInput()
	in.AllowedExternalIPs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	old := svService("zz-old", "10.96.0.10", svHTTP, born(10, "b"), xips("192.0.2.5"))
	young := svService("aa-young", "10.96.0.20", svHTTP, born(20, "a"), xips("192.0.2.5"))
	for _, order := range [][]corev1.Service{{old, young}, {young, old}} {
		in.Services = order
		if got := externalEntries(ComputeServices(in)); !slices.Equal(got, []string{"192.0.2.5:80 via 10.96.0.10"}) {
			t.Errorf("older zz-old should keep 192.0.2.5: %v", got)
		}
	}
	same := svService("aa-same", "10.96.0.20", svHTTP, born(10, "c"), xips("192.0.2.5"))
	in.Services = []corev1.Service{same, old}
	if got := externalEntries(ComputeServices(in)); !slices.Equal(got, []string{"192.0.2.5:80 via 10.96.0.10"}) {
		t.Errorf("same second: the lower UID should keep it: %v", got)
	}
	lb := svService("lb", "10.96.0.30", svHTTP, born(99, "z"), func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.5"}}
	})
	in.Services = []corev1.Service{old, lb}
	st := ComputeServices(in)
	if got := externalEntries(st); len(got) != 0 {
		t.Errorf("an external IP took a load balancer address: %v", got)
	}

	p := ExternalIPProblems(ExternalIPInput{Networks: in.Networks, BindingPolicies: in.BindingPolicies,
		Namespaces: in.Namespaces, Services: []corev1.Service{young, old, lb}, Allowed: in.AllowedExternalIPs})
	if got := ExternalIPProblem(p[ServiceKeyOf("default", "aa-young")]); !strings.HasPrefix(got, "ExternalIPContested: ") ||
		!strings.Contains(got, "default/lb (LoadBalancer)") {
		t.Errorf("aa-young's problem: %q", got)
	}
	if got := ExternalIPProblem(p[ServiceKeyOf("default", "zz-old")]); !strings.Contains(got, "default/lb") {
		t.Errorf("zz-old's problem: %q", got)
	}
	if _, ok := p[ServiceKeyOf("default", "lb")]; ok {
		t.Errorf("lb has no external IPs, got a problem: %v", p)
	}
}

// TestExternalIPProblemsMatchTheAgents: on random Services naming random
// addresses, what the controller reports as refused is exactly what the
// agents' computation leaves out: every external IP of a bound Service is
// either served for it (on all its ports) or reported.
func TestExternalIPProblemsMatchTheAgents(t *testing.T) {
	addrs := []string{"192.0.2.1", "192.0.2.2", "192.0.2.3", "198.51.100.1", "10.96.0.99", "172.30.0.11"}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		in := svInput()
		in.Reserved = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("172.30.0.11/32")}
		in.AllowedExternalIPs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("172.30.0.0/24")}
		n := 2 + rng.IntN(6)
		for i := range n {
			// Mixed ports and protocols: an address is owned across
			// them, never shared port by port.
			protos := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
			var ports []corev1.ServicePort
			for k := range 1 + rng.IntN(3) {
				ports = append(ports, svPort(fmt.Sprintf("p%d", k), protos[rng.IntN(len(protos))], int32(80+rng.IntN(3))))
			}
			opts := []svcOpt{born(rng.IntN(4), fmt.Sprintf("uid-%d", rng.IntN(100)))}
			var x []string
			for range rng.IntN(3) {
				x = append(x, addrs[rng.IntN(len(addrs))])
			}
			opts = append(opts, xips(x...))
			if rng.IntN(4) == 0 {
				opts = append(opts, func(s *corev1.Service) {
					s.Spec.Type = corev1.ServiceTypeLoadBalancer
					in := corev1.LoadBalancerIngress{IP: addrs[rng.IntN(3)]}
					if rng.IntN(3) == 0 {
						in.IPMode = ptrTo(corev1.LoadBalancerIPModeProxy)
					}
					s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{in}
				})
			}
			in.Services = append(in.Services, svService(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.1.%d", i), ports, opts...))
		}
		st := ComputeServices(in)
		served := map[string]bool{} // "svc ClusterIP|addr|proto|port"
		for _, s := range st.Services {
			if s.Frontend == tables.FrontendExternalIP {
				served[fmt.Sprintf("%s|%s|%d|%d", s.ClusterIP, s.VIP, s.Proto, s.Port)] = true
			}
		}
		problems := ExternalIPProblems(ExternalIPInput{Networks: in.Networks, BindingPolicies: in.BindingPolicies,
			Namespaces: in.Namespaces, Services: in.Services, Reserved: in.Reserved, Allowed: in.AllowedExternalIPs})
		for _, svc := range in.Services {
			reported := map[string]bool{}
			for _, r := range problems[ServiceKeyOf(svc.Namespace, svc.Name)] {
				reported[r.Addr] = true
			}
			for _, x := range svc.Spec.ExternalIPs {
				// Served on every port of the Service, or on none and
				// reported: never part of them.
				n := 0
				for _, sp := range svc.Spec.Ports {
					proto, _ := IPProto(sp.Protocol)
					if served[fmt.Sprintf("%s|%s|%d|%d", svc.Spec.ClusterIP, x, proto, sp.Port)] {
						n++
					}
				}
				all := n == len(svc.Spec.Ports)
				if n != 0 && !all || all == reported[x] {
					t.Fatalf("seed %d: %s's %s served on %d of %d ports, reported %v (problems %v)", seed, svc.Name, x, n, len(svc.Spec.Ports), reported[x], problems)
				}
			}
		}
	}
}
