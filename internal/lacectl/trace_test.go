package lacectl

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/pkg/scheme"
)

// The traced cluster: two nodes; the chart's defaults (default <-> world);
// frontend -> backend one way; an anonymous network left closed; two
// networks red and blue whose subnets overlap, with a pod each on the same
// address.

func tpod(ns, name, node string, labels map[string]string, ips ...string) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, UID: types.UID("uid-" + ns + "-" + name)},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	return p
}

func tnep(p corev1.Pod, network string) lacev1.NetworkEndpoint {
	ne := lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name,
		Labels: map[string]string{lacev1.LabelPodUID: string(p.UID), netLabel: network}},
		Spec: lacev1.NetworkEndpointSpec{Network: network, Node: p.Spec.NodeName}}
	for _, ip := range p.Status.PodIPs {
		ne.Spec.Addresses = append(ne.Spec.Addresses, lacev1.IPAddress(ip.IP))
	}
	return ne
}

func tuep(node, locator string, addrs ...string) lacev1.UnderlayEndpoint {
	u := lacev1.UnderlayEndpoint{ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec: lacev1.UnderlayEndpointSpec{Node: node, Locator: lacev1.CIDR(locator)}}
	for _, a := range addrs {
		u.Spec.Addresses = append(u.Spec.Addresses, lacev1.IPAddress(a))
	}
	return u
}

func tnbp(name, network string, priority int32, sel map[string]string) lacev1.NetworkBindingPolicy {
	p := lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: lacev1.NetworkBindingPolicySpec{Network: network, Priority: priority, MatchKind: lacev1.MatchKindPod}}
	if sel != nil {
		p.Spec.Selector = &metav1.LabelSelector{MatchLabels: sel}
	}
	return p
}

func traceCluster() TraceInput {
	secret := tnet("secret", 6, lacev1.NetworkTypeL3, nil, "10.40.0.0/16")
	secret.Spec.Anonymous = true
	client := tpod("default", "client", "node-a", nil, "10.244.1.5", "fd00:244:0:1::5")
	neighbour := tpod("default", "neighbour", "node-a", nil, "10.244.1.6", "fd00:244:0:1::6")
	server := tpod("default", "server", "node-b", nil, "10.244.2.7", "fd00:244:0:2::7")
	web := tpod("shop", "web", "node-a", map[string]string{"tier": "frontend"}, "10.10.1.4")
	// db has no NetworkEndpoint yet: its network comes from the binding
	// policies.
	db := tpod("shop", "db", "node-b", map[string]string{"tier": "backend"}, "10.20.2.4")
	s1 := tpod("vault", "s1", "node-a", map[string]string{"vault": "yes"}, "10.40.1.2")
	s2 := tpod("vault", "s2", "node-b", map[string]string{"vault": "yes"}, "10.40.2.2")
	x := tpod("a", "x", "node-a", map[string]string{"colour": "red"}, "10.50.1.3")
	y := tpod("b", "y", "node-b", map[string]string{"colour": "blue"}, "10.50.1.3")
	proxy := tpod("kube-system", "proxy", "node-a", nil, "192.168.10.1", "fd00:10::1")
	proxy.Spec.HostNetwork = true
	pending := tpod("default", "pending", "", nil)
	pending.Status.Phase = corev1.PodPending
	var nss []corev1.Namespace
	for _, n := range []string{"default", "kube-system", "shop", "vault", "a", "b"} {
		nss = append(nss, corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/metadata.name": n}}})
	}
	in := TraceInput{
		Networks: []lacev1.Network{
			*tnet("default", 1, lacev1.NetworkTypeL3, nil, "10.244.0.0/16", "fd00:244::/56"),
			*tnet("world", 2, lacev1.NetworkTypeExternal, nil, "0.0.0.0/0", "::/0"),
			*tnet("frontend", 3, lacev1.NetworkTypeL3, map[string]string{"tier": "frontend"}, "10.10.0.0/16"),
			*tnet("backend", 4, lacev1.NetworkTypeL3, map[string]string{"tier": "backend"}, "10.20.0.0/16"),
			*secret,
			*tnet("red", 7, lacev1.NetworkTypeL3, nil, "10.50.0.0/16"),
			*tnet("blue", 8, lacev1.NetworkTypeL3, nil, "10.50.0.0/16"),
		},
		RoutingPolicies: []lacev1.NetworkRoutingPolicy{
			*tnrp("default-to-world", map[string]string{netLabel: "default"}, map[string]string{netLabel: "world"}),
			*tnrp("world-to-default", map[string]string{netLabel: "world"}, map[string]string{netLabel: "default"}),
			*tnrp("frontend-to-backend", map[string]string{"tier": "frontend"}, map[string]string{"tier": "backend"}),
		},
		BindingPolicies: []lacev1.NetworkBindingPolicy{
			tnbp("catch-all", "default", math.MaxInt32, nil),
			tnbp("shop-frontend", "frontend", 10, map[string]string{"tier": "frontend"}),
			tnbp("shop-backend", "backend", 10, map[string]string{"tier": "backend"}),
			tnbp("vault", "secret", 10, map[string]string{"vault": "yes"}),
			tnbp("red", "red", 10, map[string]string{"colour": "red"}),
			tnbp("blue", "blue", 10, map[string]string{"colour": "blue"}),
		},
		Namespaces: nss,
		Pods:       []corev1.Pod{client, neighbour, server, web, db, s1, s2, x, y, proxy, pending},
		NetworkEndpoints: []lacev1.NetworkEndpoint{
			tnep(client, "default"), tnep(neighbour, "default"), tnep(server, "default"),
			tnep(web, "frontend"), tnep(s1, "secret"), tnep(s2, "secret"), tnep(x, "red"), tnep(y, "blue"),
		},
		UnderlayEndpoints: []lacev1.UnderlayEndpoint{
			tuep("node-a", "fc00:0:a::/64", "192.168.10.1", "fd00:10::1"),
			tuep("node-b", "fc00:0:b::/64", "192.168.10.2", "fd00:10::2"),
		},
	}
	addServices(&in)
	return in
}

func runTrace(t *testing.T, in TraceInput) []byte {
	t.Helper()
	r, err := Trace(in)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := r.Print(&out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestTraceGolden: one golden file per question (testdata/trace-NAME.txt;
// -update rewrites them), and the lines an operator reads first.
func TestTraceGolden(t *testing.T) {
	noWorld := func(in *TraceInput) {
		var nets []lacev1.Network
		for _, n := range in.Networks {
			if n.Name != "world" {
				nets = append(nets, n)
			}
		}
		in.Networks = nets
	}
	// An external network partner (198.51.100.0/24) that no policy opens
	// to anything.
	partner := func(in *TraceInput) {
		in.Networks = append(in.Networks, *tnet("partner", 9, lacev1.NetworkTypeExternal, nil, "198.51.100.0/24"))
	}
	for _, tc := range []struct {
		name, src, dst, proto, ns, node string
		ipv6                            bool
		change                          func(*TraceInput)
		want                            []string
	}{
		{name: "same-network-other-node", src: "client", dst: "default/server",
			want: []string{"ALLOWED  own network default",
				"SID fc00:0:b:0:100:1:0:1 (locator of node node-b, source network default id 1, destination network default id 1), node node-b decapsulates and delivers",
				"replies:      return through conntrack",
				"reverse:      a new flow default/server -> default/client is ALLOWED"}},
		{name: "same-network-other-node-ipv6", src: "client", dst: "server", proto: "udp/53", ipv6: true,
			want: []string{"ALLOWED", "fd00:244:0:1::5", "fd00:244:0:2::7", "view entry fd00:244::/56 of network default"}},
		{name: "same-node", src: "client", dst: "neighbour", proto: "icmp",
			want: []string{"ALLOWED", "path:         delivered on node node-a"}},
		{name: "other-network-isolated", src: "default/client", dst: "shop/web",
			want: []string{"DENIED  no view: no NetworkRoutingPolicy default -> frontend",
				`dropped:      on node node-a, counted as lace_datapath_dropped_packets_total{reason="isolated"}`,
				"replies:      none",
				"reverse:      a new flow shop/web -> default/client is DENIED  no view: no NetworkRoutingPolicy frontend -> default"}},
		{name: "frontend-to-backend", src: "web", dst: "db", ns: "shop", proto: "tcp/5432",
			want: []string{"ALLOWED  NetworkRoutingPolicy frontend-to-backend (frontend -> backend)",
				"network backend (NetworkBindingPolicy shop-backend, no NetworkEndpoint yet)",
				"source network frontend id 3, destination network backend id 4",
				"reverse:      a new flow shop/db -> shop/web is DENIED"}},
		{name: "backend-to-frontend", src: "shop/db", dst: "shop/web", proto: "tcp/5432",
			want: []string{"DENIED  no view: no NetworkRoutingPolicy backend -> frontend",
				`dropped:      on node node-b, counted as lace_datapath_dropped_packets_total{reason="isolated"}`,
				"reverse:      a new flow shop/web -> shop/db is ALLOWED  NetworkRoutingPolicy frontend-to-backend"}},
		{name: "anonymous-closed", src: "vault/s1", dst: "vault/s2",
			want: []string{"DENIED  anonymous network secret without self policy",
				`reason="anonymous-network"`}},
		{name: "pod-to-outside-snat", src: "client", dst: "8.8.8.8", proto: "udp/53",
			want: []string{"ALLOWED  NetworkRoutingPolicy default-to-world (default -> world)",
				"view entry 0.0.0.0/0 of network world (granted by NetworkRoutingPolicy default-to-world)",
				"leaves node node-a's underlay with source translated to node-a's address 192.168.10.1 (SNAT, reversed by conntrack)",
				"reverse:      a new flow 8.8.8.8 -> default/client is ALLOWED  NetworkRoutingPolicy world-to-default"}},
		{name: "pod-to-outside-snat-ipv6", src: "client", dst: "2001:db8::53", proto: "udp/53",
			want: []string{"ALLOWED", "fd00:244:0:1::5", "source translated to node-a's address fd00:10::1"}},
		{name: "outside-to-pod-ipv6", src: "2001:db8::53", dst: "client", proto: "udp/53",
			want: []string{"ALLOWED", "classified into world by ::/0", "fd00:244:0:1::5"}},
		{name: "pod-to-unused-pod-address", src: "client", dst: "10.244.3.3",
			want: []string{"DENIED", "address 10.244.3.3, held by no pod (in the subnet of default)"}},
		{name: "host-network-pod-to-pod", src: "kube-system/proxy", dst: "default/server",
			want: []string{"ALLOWED", "host-network pod kube-system/proxy: node node-a's host stack (192.168.10.1)"}},
		{name: "pod-to-own-node", src: "client", dst: "192.168.10.1", proto: "tcp/10250",
			want: []string{"ALLOWED", "handed to node node-a's host stack, source preserved (pod addresses are unique per node)"}},
		{name: "outside-to-pod-via-world", src: "203.0.113.9", dst: "default/server", proto: "tcp/443",
			want: []string{"ALLOWED  NetworkRoutingPolicy world-to-default (world -> default)",
				"source:       outside address 203.0.113.9, classified into world by 0.0.0.0/0",
				"enters the cluster at any node as plain IP, classified into world by 0.0.0.0/0, delivered (encapsulated to node node-b, SID fc00:0:b:0:100:2:0:1, if it enters at another node) with its source preserved"}},
		{name: "outside-unclassified", src: "203.0.113.9", dst: "default/server", change: noWorld,
			want: []string{"DENIED  unclassified: no external network's prefix covers source 203.0.113.9",
				"in no network",
				`dropped:      on the node where it enters, counted as lace_datapath_dropped_packets_total{reason="unclassified-source"}`}},
		{name: "outside-to-isolated-pod", src: "203.0.113.9", dst: "shop/web",
			want: []string{"DENIED", `dropped:      on the node where it enters, counted as lace_datapath_dropped_packets_total{reason="isolated"}`}},
		{name: "node-to-own-pod", src: "192.168.10.2", dst: "server", proto: "tcp/8080",
			want: []string{"ALLOWED  node reaches its own pods",
				"source:       node node-b's host stack (192.168.10.2), not classified",
				"path:         the node reaches its own pods (kubelet probes)"}},
		{name: "node-to-own-pod-no-policy", src: "192.168.10.1", dst: "shop/web", proto: "tcp/8080",
			want: []string{"ALLOWED  node reaches its own pods", "reverse:      a new flow shop/web -> node node-a (192.168.10.1) is DENIED"}},
		{name: "node-to-other-pod", src: "192.168.10.1", dst: "server", proto: "tcp/8080",
			want: []string{"ALLOWED  NetworkRoutingPolicy world-to-default",
				"sent by node node-a's host stack as plain IP, classified into world by 0.0.0.0/0, encapsulated in SRv6 to SID fc00:0:b:0:100:2:0:1"}},
		{name: "svc-own-network", src: "client", dst: "web",
			want: []string{"ALLOWED  own network default",
				"flow:         tcp/80 default/client -> service default/web 10.96.0.10",
				"destination:  service default/web VIP 10.96.0.10 port tcp/80 (http), network default (NetworkBindingPolicy services); view entry 10.96.0.10/32 of network default",
				"path:         DNAT on node node-a to one of 2 endpoints eligible there, picked uniformly at random (1/2 each), reached in network default:",
				"  10.244.1.6:8080 (pod default/neighbour on node node-a): delivered on node node-a",
				"  10.244.2.7:8080 (pod default/server on node node-b): node node-a encapsulates in SRv6 to SID fc00:0:b:0:100:1:0:1 (locator of node node-b, source network default id 1, destination network default id 1), node node-b decapsulates and delivers",
				"replies are translated back from the VIP (they come from 10.96.0.10:80)",
				"sessionAffinity ClientIP: a client keeps its endpoint for 10800s",
				"3 more not eligible on node node-a (lacectl services -n default --node node-a says why)",
				"replies:      return through conntrack, from the VIP: reply of a flow admitted by own network default",
				"reverse:      none: a service opens no flows"}},
		{name: "svc-by-vip", src: "client", dst: "10.96.0.10", proto: "tcp/80",
			want: []string{"ALLOWED  own network default", "service default/web VIP 10.96.0.10"}},
		{name: "svc-ipv6", src: "client", dst: "default/web", ipv6: true,
			want: []string{"ALLOWED", "service default/web fd00:96::10", "[fd00:244:0:2::7]:8080 (pod default/server on node node-b)", "they come from [fd00:96::10]:80"}},
		{name: "svc-nrp", src: "web", dst: "api", ns: "shop",
			want: []string{"ALLOWED  NetworkRoutingPolicy frontend-to-backend (frontend -> backend)",
				"port tcp/5432 (pg), network backend (NetworkBindingPolicy shop-services)",
				"view entry 10.96.1.20/32 of network backend (granted by NetworkRoutingPolicy frontend-to-backend)",
				"10.20.2.4:5432 (pod shop/db on node node-b): node node-a encapsulates in SRv6 to SID fc00:0:b:0:100:3:0:4 (locator of node node-b, source network frontend id 3, destination network backend id 4)"}},
		{name: "svc-srp", src: "client", dst: "shop/api",
			want: []string{"ALLOWED  ServiceRoutingPolicy default-to-shop-services (default -> the services of backend: VIPs only, not the pods)",
				"(granted by ServiceRoutingPolicy default-to-shop-services: the VIP only)",
				"SID fc00:0:b:0:100:1:0:4 (locator of node node-b, source network default id 1, destination network backend id 4)"}},
		{name: "svc-srp-not-the-pods", src: "client", dst: "shop/db", proto: "tcp/5432",
			want: []string{"DENIED  no view: no NetworkRoutingPolicy default -> backend"}},
		{name: "svc-srp-other-namespace", src: "client", dst: "reports",
			want: []string{"DENIED  no view: no NetworkRoutingPolicy default -> backend; ServiceRoutingPolicy default-to-shop-services selects the services of backend only in namespaces matching kubernetes.io/metadata.name=shop, not default (service default/reports)",
				"not in the view of default",
				`dropped:      on node node-a, counted as lace_datapath_dropped_packets_total{reason="isolated"}`}},
		{name: "svc-anonymous-closed", src: "vault/s1", dst: "vault/kms",
			want: []string{"DENIED  anonymous network secret without self policy: its own services are out of its view too", `reason="isolated"`}},
		{name: "svc-other-network", src: "shop/web", dst: "default/web",
			want: []string{"DENIED  no view: no NetworkRoutingPolicy frontend -> default"}},
		{name: "svc-no-endpoints", src: "client", dst: "empty",
			want: []string{"ALLOWED", `path:         rejected on node node-a: ICMP port unreachable, counted as lace_datapath_dropped_packets_total{reason="no-endpoints"}`}},
		{name: "svc-no-local-endpoints", src: "client", dst: "local",
			want: []string{"ALLOWED", `path:         dropped on node node-a, counted as lace_datapath_dropped_packets_total{reason="no-local-endpoints"}: internalTrafficPolicy Local`}},
		{name: "svc-local-endpoint", src: "server", dst: "local",
			want: []string{"10.244.2.7:8080 (pod default/server on node node-b): the client itself: hairpin, delivered back to it from the VIP 10.96.0.11:80"}},
		{name: "svc-outside-endpoint", src: "client", dst: "kubernetes",
			want: []string{"ALLOWED  own network default", "flow:         tcp/443",
				"192.168.10.100:6443 (no pod): outside the cluster: leaves node node-a's underlay with source translated to node-a's address 192.168.10.1 (SNAT to the node address, reversed by conntrack); default reaches it by NetworkRoutingPolicy default-to-world (default -> world)"}},
		{name: "svc-outside-endpoint-unreached", src: "client", dst: "kubernetes", change: noWorld,
			want: []string{"192.168.10.100:6443 (no pod): outside the cluster: dropped, counted as lace_datapath_dropped_packets_total{reason=\"isolated\"}: the view of default does not reach it"}},
		{name: "svc-hairpin", src: "client", dst: "self",
			want: []string{"10.244.1.5:8080 (pod default/client on node node-a): the client itself: hairpin, delivered back to it from the VIP 10.96.0.16:80"}},
		{name: "svc-prefer-closest-zone", src: "server", dst: "closest",
			want: []string{"DNAT on node node-b to the one endpoint eligible there, reached in network default:", "10.244.1.6:8080 (pod default/neighbour on node node-a): node node-b encapsulates", "1 more not eligible on node node-b"}},
		{name: "svc-hinted", src: "server", dst: "hinted",
			want: []string{"10.244.1.6:8080 (pod default/neighbour on node node-a)", "1 more not eligible"}},
		{name: "svc-draining", src: "client", dst: "draining",
			want: []string{"DNAT on node node-a to the one endpoint eligible there", "10.244.2.7:8080 (pod default/server on node node-b)"}},
		{name: "svc-port-not-served", src: "client", dst: "web", proto: "tcp/81",
			want: []string{"ALLOWED", `rejected on node node-a: ICMP port unreachable, counted as lace_datapath_dropped_packets_total{reason="no-service-port"}: service default/web has no port tcp/81 (its ports: tcp/80)`}},
		{name: "svc-icmp", src: "client", dst: "web", proto: "icmp",
			want: []string{"ALLOWED", `dropped on node node-a, counted as lace_datapath_dropped_packets_total{reason="no-service-port"}: the data plane translates TCP and UDP to a VIP, not icmp`}},
		{name: "svc-from-outside", src: "203.0.113.9", dst: "10.96.0.10", proto: "tcp/80",
			want: []string{"DENIED  no view: a ClusterIP is reached from pods and nodes only; outside clients use the service's NodePorts",
				"classified into world by 0.0.0.0/0",
				`dropped:      on the node where it enters, counted as lace_datapath_dropped_packets_total{reason="isolated"}`}},
		{name: "svc-from-node", src: "192.168.10.1", dst: "default/web",
			want: []string{"ALLOWED  NetworkRoutingPolicy world-to-default (world -> default)",
				"path:         connect-time translation on node node-a: the socket is pointed at one of 2 endpoints eligible there, picked uniformly at random (1/2 each):",
				"  10.244.1.6:8080 (pod default/neighbour on node node-a): the node reaches its own pods",
				"  10.244.2.7:8080 (pod default/server on node node-b): sent by node node-a's host stack as plain IP, classified into world by 0.0.0.0/0, encapsulated in SRv6 to SID fc00:0:b:0:100:2:0:1",
				"the socket sees the VIP as its peer (10.96.0.10:80; datagrams are translated back)",
				"replies:      return through conntrack to the socket, which sees them from the VIP"}},
		{name: "svc-from-node-outside-endpoint", src: "192.168.10.2", dst: "kubernetes",
			want: []string{"ALLOWED", "192.168.10.100:6443 (no pod): outside the cluster: sent by node node-b's host stack from its own address, not through Lace"}},
		{name: "svc-from-host-network-pod-not-granted", src: "kube-system/proxy", dst: "default/reports",
			want: []string{"DENIED  no view: no NetworkRoutingPolicy world -> backend",
				`dropped:      on node node-a, counted as lace_datapath_dropped_packets_total{reason="isolated"}; the connect fails with EPERM`}},
		{name: "svc-from-node-srp-endpoint-unreached", src: "192.168.10.1", dst: "shop/api",
			want: []string{"ALLOWED  ServiceRoutingPolicy world-to-shop-services (world -> the services of backend: VIPs only, not the pods)",
				`10.20.2.4:5432 (pod shop/db on node node-b): sent by node node-a's host stack as plain IP and dropped on node node-b, counted as lace_datapath_dropped_packets_total{reason="isolated"}: judged like any outside host's: no view: no NetworkRoutingPolicy world -> backend`}},
		{name: "svc-explicit", src: "pod:default/cache", dst: "svc:cache",
			want: []string{"flow:         tcp/6379 default/cache -> service default/cache 10.96.0.18", "the client itself: hairpin"}},
		// External frontends, from outside.
		{name: "xlb-nodeport", src: "203.0.113.9", dst: "192.168.10.1", proto: "tcp/30080",
			want: []string{"ALLOWED  world reaches ClusterIP 10.96.0.40 of service default/front: NetworkRoutingPolicy world-to-default (world -> default)",
				"flow:         tcp/30080 203.0.113.9 -> service default/front NodePort on 192.168.10.1 (node node-a's address)",
				"source:       outside address 203.0.113.9, classified into world by 0.0.0.0/0",
				"destination:  service default/front NodePort on 192.168.10.1 (node node-a's address) port tcp/30080 (http) to ClusterIP 10.96.0.40:80, network default (NetworkBindingPolicy services); the ClusterIP is view entry 10.96.0.40/32 of network default in the view of world (granted by NetworkRoutingPolicy world-to-default)",
				"entry:        node node-a, whose address it is",
				"path:         DNAT on node node-a to one of 2 endpoints eligible there (externalTrafficPolicy Cluster), picked uniformly at random (1/2 each), reached in network default:",
				"  10.244.1.6:8080 (pod default/neighbour on node node-a): delivered on node node-a with the client's address 203.0.113.9",
				"  10.244.2.7:8080 (pod default/server on node node-b): node node-a translates the source to its address 192.168.10.1 (SNAT, reversed for the answers) and encapsulates in SRv6 to SID fc00:0:b:0:100:ffff:0:1 (locator of node node-b, the nodes' context id 65535, destination network default id 1), node node-b decapsulates and delivers: the endpoint sees node node-a's address, not the client's",
				"answers leave node node-a from the frontend (they come from 192.168.10.1:30080)",
				"replies:      return through conntrack, from the frontend 192.168.10.1:30080: reply of a flow admitted by world reaches ClusterIP 10.96.0.40",
				"reverse:      none: a service opens no flows"}},
		{name: "xlb-nodeport-ipv6", src: "2001:db8::9", dst: "fd00:10::2", proto: "tcp/30080",
			want: []string{"ALLOWED  world reaches ClusterIP fd00:96::40 of service default/front",
				"classified into world by ::/0", "to ClusterIP [fd00:96::40]:80",
				"[fd00:244:0:2::7]:8080 (pod default/server on node node-b): delivered on node node-b with the client's address 2001:db8::9",
				"[fd00:244:0:1::6]:8080 (pod default/neighbour on node node-a): node node-b translates the source to its address fd00:10::2"}},
		{name: "xlb-loadbalancer", src: "203.0.113.9", dst: "192.168.20.10",
			want: []string{"ALLOWED  world reaches ClusterIP 10.96.0.40 of service default/front: NetworkRoutingPolicy world-to-default (world -> default); in its loadBalancerSourceRanges",
				"flow:         tcp/80 203.0.113.9 -> service default/front LoadBalancer 192.168.20.10",
				"entry:        node node-b: class lab, announced by node node-b (rendezvous among 2 eligible nodes: alive)",
				"DNAT on node node-b to one of 2 endpoints eligible there",
				"node node-b translates the source to its address 192.168.10.2",
				"they come from 192.168.20.10:80"}},
		{name: "xlb-source-range", src: "192.0.2.99", dst: "192.168.20.10", proto: "tcp/80",
			want: []string{"DENIED  loadBalancerSourceRanges of service default/front (203.0.113.0/24) do not hold 192.0.2.99",
				`dropped:      on node node-b, counted as lace_datapath_dropped_packets_total{reason="source-range"}`,
				"replies:      none: no admitted flow to reply to"}},
		{name: "xlb-external-ip", src: "203.0.113.9", dst: "198.51.100.7",
			want: []string{"ALLOWED  world reaches ClusterIP 10.96.0.40 of service default/front",
				"flow:         tcp/80 203.0.113.9 -> service default/front external IP 198.51.100.7",
				"entry:        node node-a, the first by name: 198.51.100.7 is an external IP, which enters where the network sends it (--node picks another)"}},
		{name: "xlb-external-ip-node", src: "203.0.113.9", dst: "198.51.100.7", node: "node-c",
			want: []string{"entry:        node node-c (--node): 198.51.100.7 is an external IP, which enters where the network sends it",
				"node node-c translates the source to its address 192.168.10.3 (SNAT, reversed for the answers) and encapsulates in SRv6 to SID fc00:0:a:0:100:ffff:0:1"}},
		{name: "xlb-local-no-endpoint", src: "203.0.113.9", dst: "192.168.10.1", proto: "tcp/30081",
			want: []string{"ALLOWED  world reaches ClusterIP 10.96.0.41 of service default/edge",
				`path:         dropped on node node-a, counted as lace_datapath_dropped_packets_total{reason="no-local-endpoints"}: externalTrafficPolicy Local, and node node-a has no ready endpoint of the service`,
				"replies:      none: no endpoint is reached"}},
		{name: "xlb-local", src: "203.0.113.9", dst: "192.168.20.11",
			want: []string{"entry:        node node-b: class lab, announced by node node-b (rendezvous among 1 eligible node: alive and holding a ready endpoint (externalTrafficPolicy Local))",
				"DNAT on node node-b to the one endpoint eligible there (externalTrafficPolicy Local: this node's own), reached in network default:",
				"10.244.2.7:8080 (pod default/server on node node-b): delivered on node node-b with the client's address 203.0.113.9"}},
		{name: "xlb-nodeport-closed", src: "203.0.113.9", dst: "192.168.10.1", proto: "tcp/30082",
			want: []string{"DENIED  NodePort closed on node node-a's address 192.168.10.1: it is classified into world by 0.0.0.0/0, which does not reach ClusterIP 10.96.1.22 of service default/backoffice: no view: no NetworkRoutingPolicy world -> backend",
				"the ClusterIP is not in the view of world",
				`dropped:      on node node-a, counted as lace_datapath_dropped_packets_total{reason="frontend-closed"}`}},
		{name: "xlb-nodeport-srp", src: "203.0.113.9", dst: "192.168.10.1", proto: "tcp/30443",
			want: []string{"ALLOWED  world reaches ClusterIP 10.96.1.23 of service shop/admin: ServiceRoutingPolicy world-to-shop-services (world -> the services of backend: VIPs only, not the pods)",
				"(granted by ServiceRoutingPolicy world-to-shop-services: the VIP only)",
				"10.20.2.4:8443 (pod shop/db on node node-b): node node-a translates the source to its address 192.168.10.1 (SNAT, reversed for the answers) and encapsulates in SRv6 to SID fc00:0:b:0:100:ffff:0:4 (locator of node node-b, the nodes' context id 65535, destination network backend id 4)"}},
		{name: "xlb-isolated", src: "198.51.100.9", dst: "192.168.10.2", proto: "tcp/30080", change: partner,
			want: []string{"DENIED  partner does not reach ClusterIP 10.96.0.40 of service default/front: no view: no NetworkRoutingPolicy partner -> default",
				"source:       outside address 198.51.100.9, classified into partner by 198.51.100.0/24",
				`dropped:      on node node-b, counted as lace_datapath_dropped_packets_total{reason="isolated"}`}},
		{name: "xlb-unclassified", src: "203.0.113.9", dst: "192.168.20.10", change: noWorld,
			want: []string{"DENIED  unclassified: no external network's prefix covers source 203.0.113.9",
				"source:       outside address 203.0.113.9, in no network: no external network's prefix covers it",
				`dropped:      on node node-b, counted as lace_datapath_dropped_packets_total{reason="unclassified-source"}`}},
		{name: "xlb-not-announced", src: "203.0.113.9", dst: "192.168.30.5",
			want: []string{"DENIED  not announced: no node answers ARP for 192.168.30.5",
				"entry:        none: class edge, announced by none eligible: no node is alive and selected by class edge",
				"dropped:      nowhere: the flow never enters the cluster (no node answers ARP for 192.168.30.5; no drop counter)"}},
		{name: "svc-from-outside-frontends", src: "203.0.113.9", dst: "default/front",
			want: []string{"DENIED  no view: a ClusterIP is reached from pods and nodes only",
				`dropped:      on the node where it enters, counted as lace_datapath_dropped_packets_total{reason="isolated"}; from outside it is reached at NodePort tcp/30080 of every node address, LoadBalancer 192.168.20.10, LoadBalancer fd00:20::10 and external IP 198.51.100.7 (trace those)`}},
		{name: "xlb-no-endpoints", src: "203.0.113.9", dst: "203.0.113.200",
			want: []string{"ALLOWED  world reaches ClusterIP 10.96.0.43 of service default/foreign",
				"entry:        node node-a, the first by name: 203.0.113.200 is a LoadBalancer VIP (class example.com/lb, not Lace's: announced by no Lace node), which enters where the network sends it (--node picks another)",
				`path:         dropped on node node-a, counted as lace_datapath_dropped_packets_total{reason="no-endpoints"}: the service has no ready or serving endpoint`}},
		{name: "address-of-a-pod", src: "10.244.1.5", dst: "10.244.2.7",
			want: []string{"ALLOWED  own network default", "flow:         tcp/80 default/client -> default/server"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := traceCluster()
			if tc.change != nil {
				tc.change(&in)
			}
			in.Src, in.Dst, in.Proto, in.Namespace, in.IPv6, in.Node = tc.src, tc.dst, tc.proto, tc.ns, tc.ipv6, tc.node
			out := runTrace(t, in)
			golden(t, "trace-"+tc.name+".txt", out)
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("no %q in\n%s", w, out)
				}
			}
		})
	}
}

// TestTraceErrors: questions Trace cannot answer say why, naming what the
// user should change.
func TestTraceErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src, dst, proto string
		ipv6                  bool
		want                  string
	}{
		{"ambiguous-address", "10.50.1.3", "default/client", "",
			false, "address 10.50.1.3 is held by pods a/x (net red) and b/y (net blue): name the pod"},
		{"unknown-pod", "default/client", "x", "", false, "pod or service default/x not found"},
		{"unknown-source-pod", "x", "default/client", "", false, "pod default/x not found"},
		{"unknown-pod-namespaced", "nowhere/x", "default/client", "", false, "pod nowhere/x not found"},
		{"no-ipv6", "shop/web", "shop/db", "", true, "pod shop/web has no IPv6 address (its addresses: 10.10.1.4)"},
		{"family-mismatch", "client", "fd00:244:0:2::7", "", false, "pod default/client"}, // takes the IPv6 address: no error
		{"two-families", "10.244.1.5", "fd00:244:0:2::7", "", false, "10.244.1.5 and fd00:244:0:2::7 are of different address families"},
		{"no-pod", "8.8.8.8", "192.168.10.1", "", false, "neither 8.8.8.8 nor 192.168.10.1 is a pod"},
		{"no-ip-yet", "pending", "client", "", false, "pod default/pending has no IP address yet (phase Pending)"},
		{"bad-port", "client", "server", "tcp/0", false, `protocol "tcp/0": port must be 1-65535`},
		{"no-port", "client", "server", "udp", false, `protocol "udp": give a port, as in udp/80`},
		{"bad-proto", "client", "server", "gre", false, `protocol "gre": give tcp/PORT, udp/PORT, sctp/PORT or icmp`},
		{"bad-endpoint", "default/", "server", "", false, `endpoint "default/": give NAMESPACE/NAME, NAME or an IP address`},
		{"pod-and-service", "client", "cache", "", false, "default/cache names both a pod and a service: write pod:default/cache or svc:default/cache"},
		{"service-source", "default/web", "client", "", false, "default/web is a service: a service is a destination only"},
		{"vip-source", "10.96.0.10", "client", "", false, "10.96.0.10 is the VIP of service default/web: a service is a destination only"},
		{"unknown-service", "client", "svc:ghost", "", false, "service default/ghost not found"},
		{"unbound-service", "client", "broken", "", false, "service default/broken is not served: bound to no network: network ghost does not exist"},
		{"headless-service", "client", "headless", "", false, "service default/headless is not served by Lace (headless: clusterIP None)"},
		{"other-proxy", "client", "10.96.0.30", "", false, "service default/other is not served by Lace (service.kubernetes.io/service-proxy-name=someone-else: another proxy's)"},
		{"no-ipv6-vip", "client", "kubernetes", "", true, "service default/kubernetes has no IPv6 VIP (its VIPs: 10.96.0.1)"},
		{"vip-family", "fd00:244:0:1::5", "10.96.0.10", "", false, "fd00:244:0:1::5 and 10.96.0.10 are of different address families"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := traceCluster()
			in.Src, in.Dst, in.Proto, in.IPv6 = tc.src, tc.dst, tc.proto, tc.ipv6
			r, err := Trace(in)
			if tc.name == "family-mismatch" {
				if err != nil || r.Dst.Addr.String() != "fd00:244:0:2::7" || r.Src.Addr.String() != "fd00:244:0:1::5" {
					t.Fatalf("a pod facing an IPv6 address should use its IPv6 address: %+v, %v", r, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error; result %+v", r)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestTraceFrontendErrors: questions about external frontends Trace
// cannot answer say why.
func TestTraceFrontendErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src, dst, proto, node, want string
	}{
		{name: "from-a-pod", src: "client", dst: "192.168.20.10",
			want: "192.168.20.10 tcp/80 is a LoadBalancer VIP or external IP of service default/front: lacectl trace follows flows to external frontends from outside addresses; a pod or a node is admitted to one as to the service's ClusterIP: trace client svc:NAMESPACE/NAME"},
		{name: "from-a-node", src: "192.168.10.2", dst: "192.168.10.1", proto: "tcp/30080",
			want: "192.168.10.1 tcp/30080 is a NodePort on node node-a's address of service default/front"},
		{name: "no-such-nodeport", src: "203.0.113.9", dst: "192.168.10.1", proto: "tcp/30999",
			want: "neither 203.0.113.9 nor 192.168.10.1 is a pod: lacectl trace answers for flows from or to pods (a node never carries traffic between outside addresses); tcp/30999 is no service's NodePort"},
		{name: "nodeport-without-port", src: "203.0.113.9", dst: "192.168.10.1",
			want: "; give a NodePort as PROTO/PORT to trace it"},
		{name: "vip-port-not-served", src: "203.0.113.9", dst: "192.168.20.10", proto: "tcp/81",
			want: "tcp/81 192.168.20.10 is no frontend on node node-b (the VIPs at 192.168.20.10: tcp/80 default/front; the data plane serves TCP and UDP)"},
		{name: "vip-other-node", src: "203.0.113.9", dst: "192.168.20.10", node: "node-a",
			want: "--node node-a: 192.168.20.10 is a LoadBalancer VIP of class lab, announced by node node-b"},
		{name: "nodeport-other-node", src: "203.0.113.9", dst: "192.168.10.1", proto: "tcp/30080", node: "node-b",
			want: "--node node-b: 192.168.10.1 is node node-a's address, where its NodePorts are served"},
		{name: "unknown-node", src: "203.0.113.9", dst: "198.51.100.7", node: "node-z", want: "node node-z not found"},
		{name: "node-for-a-pod", src: "203.0.113.9", dst: "default/server", node: "node-a",
			want: "--node node-a: only a flow from outside to an external frontend has a node to choose where it enters"},
		{name: "node-for-a-clusterip", src: "client", dst: "default/web", node: "node-b",
			want: "--node node-b: a flow to a ClusterIP is translated on the source's node"},
		{name: "two-families", src: "2001:db8::9", dst: "198.51.100.7", want: "2001:db8::9 and 198.51.100.7 are of different address families"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := traceCluster()
			in.Src, in.Dst, in.Proto, in.Node = tc.src, tc.dst, tc.proto, tc.node
			r, err := Trace(in)
			if err == nil {
				t.Fatalf("no error; result %+v", r)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestTraceFrontendVerdicts: the verdict and drop counter of each way a
// flow from outside to a frontend ends, and the counters are the data
// plane's.
func TestTraceFrontendVerdicts(t *testing.T) {
	for _, tc := range []struct {
		src, dst, proto string
		allowed         bool
		reason          string
	}{
		{"203.0.113.9", "192.168.10.1", "tcp/30080", true, ""},
		{"203.0.113.9", "192.168.10.3", "tcp/30082", false, "frontend-closed"},
		{"192.0.2.1", "192.168.20.10", "tcp/80", false, "source-range"},
		{"203.0.113.1", "192.168.20.10", "tcp/80", true, ""},
		{"192.0.2.1", "192.168.20.11", "tcp/80", true, ""}, // edge has no source ranges
		{"203.0.113.9", "192.168.30.5", "tcp/80", false, ""},
	} {
		in := traceCluster()
		in.Src, in.Dst, in.Proto = tc.src, tc.dst, tc.proto
		r, err := Trace(in)
		if err != nil {
			t.Fatalf("%s -> %s %s: %v", tc.src, tc.dst, tc.proto, err)
		}
		if r.Verdict.Allowed != tc.allowed || string(r.Verdict.Reason) != tc.reason {
			t.Errorf("%s -> %s %s: allowed %v reason %q (%s), want %v %q", tc.src, tc.dst, tc.proto,
				r.Verdict.Allowed, r.Verdict.Reason, r.Verdict.Rule, tc.allowed, tc.reason)
		}
		if tc.reason != "" && !slices.Contains(datapath.DropReasons, tc.reason) {
			t.Errorf("%s is no data plane drop reason", tc.reason)
		}
	}
}

// TestDropReasonsExist: every drop counter a golden file names is one the
// data plane counts.
func TestDropReasonsExist(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	re := regexp.MustCompile(`reason="([^"]*)"|dropped \(([a-z-]+)\)`)
	seen := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			seen++
			if r := m[1] + m[2]; !slices.Contains(datapath.DropReasons, r) {
				t.Errorf("%s: drop reason %q is not the data plane's", f, r)
			}
		}
	}
	if seen == 0 {
		t.Error("no drop reasons found in the golden files")
	}
}

// TestTraceNetworkEndpointWins: the NetworkEndpoint says what the data
// plane did, even when the binding policies now say otherwise; a record
// left from an earlier pod of the same name does not count.
func TestTraceNetworkEndpointWins(t *testing.T) {
	in := traceCluster()
	in.Src, in.Dst = "default/client", "default/server"
	in.BindingPolicies = append(in.BindingPolicies, tnbp("all-frontend", "frontend", 0, nil))
	r, err := Trace(in)
	if err != nil {
		t.Fatal(err)
	}
	if r.Src.Network != "default" || r.Src.NetworkFrom != "NetworkEndpoint" {
		t.Errorf("source network %s from %s, want default from its NetworkEndpoint", r.Src.Network, r.Src.NetworkFrom)
	}
	for i := range in.NetworkEndpoints {
		if in.NetworkEndpoints[i].Name == "client" {
			in.NetworkEndpoints[i].Labels[lacev1.LabelPodUID] = "an-earlier-pod"
		}
	}
	if r, err = Trace(in); err != nil {
		t.Fatal(err)
	}
	if r.Src.Network != "frontend" || !strings.Contains(r.Src.NetworkFrom, "all-frontend") {
		t.Errorf("stale NetworkEndpoint: source network %s from %s, want frontend from the binding policy", r.Src.Network, r.Src.NetworkFrom)
	}
}

// TestTraceCommand: the command reads what Trace needs through the client,
// for named pods and for addresses alike.
func TestTraceCommand(t *testing.T) {
	in := traceCluster()
	var objs []client.Object
	for i := range in.Networks {
		objs = append(objs, &in.Networks[i])
	}
	for i := range in.RoutingPolicies {
		objs = append(objs, &in.RoutingPolicies[i])
	}
	for i := range in.BindingPolicies {
		objs = append(objs, &in.BindingPolicies[i])
	}
	for i := range in.Namespaces {
		objs = append(objs, &in.Namespaces[i])
	}
	for i := range in.Pods {
		objs = append(objs, &in.Pods[i])
	}
	for i := range in.NetworkEndpoints {
		objs = append(objs, &in.NetworkEndpoints[i])
	}
	for i := range in.UnderlayEndpoints {
		objs = append(objs, &in.UnderlayEndpoints[i])
	}
	for i := range in.ServiceRoutingPolicies {
		objs = append(objs, &in.ServiceRoutingPolicies[i])
	}
	for i := range in.Services {
		objs = append(objs, &in.Services[i])
	}
	for i := range in.EndpointSlices {
		objs = append(objs, &in.EndpointSlices[i])
	}
	for i := range in.Nodes {
		objs = append(objs, &in.Nodes[i])
	}
	for i := range in.Classes {
		objs = append(objs, &in.Classes[i])
	}
	for i := range in.Leases {
		objs = append(objs, &in.Leases[i])
	}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...).Build()
	for _, q := range []TraceInput{
		{Src: "client", Dst: "default/server"},
		{Src: "web", Dst: "db", Namespace: "shop", Proto: "tcp/5432"},
		{Src: "10.244.1.5", Dst: "10.244.2.7"},
		{Src: "203.0.113.9", Dst: "shop/web", IPv6: true},
		{Src: "192.168.10.1", Dst: "vault/s1"},
		{Src: "client", Dst: "web"},
		{Src: "client", Dst: "10.96.0.10", Proto: "tcp/80"},
		{Src: "fd00:244:0:1::5", Dst: "fd00:96::10"},
		{Src: "web", Dst: "api", Namespace: "shop"},
		{Src: "client", Dst: "shop/api"},
		{Src: "client", Dst: "kubernetes"},
		{Src: "pod:default/cache", Dst: "svc:cache"},
		{Src: "203.0.113.9", Dst: "default/web"},
		{Src: "203.0.113.9", Dst: "192.168.10.1", Proto: "tcp/30080"},
		{Src: "203.0.113.9", Dst: "192.168.10.2", Proto: "tcp/30443"},
		{Src: "2001:db8::9", Dst: "fd00:10::2", Proto: "tcp/30080"},
		{Src: "203.0.113.9", Dst: "192.168.20.10"},
		{Src: "203.0.113.9", Dst: "192.168.20.11"},
		{Src: "203.0.113.9", Dst: "192.168.30.5"},
		{Src: "203.0.113.9", Dst: "198.51.100.7", Node: "node-b"},
	} {
		var out bytes.Buffer
		q.Now = now
		if err := TraceCommand(context.Background(), c, q, &out); err != nil {
			t.Fatalf("%s -> %s: %v", q.Src, q.Dst, err)
		}
		pure := traceCluster()
		pure.Src, pure.Dst, pure.Namespace, pure.Proto, pure.IPv6, pure.Node = q.Src, q.Dst, q.Namespace, q.Proto, q.IPv6, q.Node
		if want := runTrace(t, pure); !bytes.Equal(out.Bytes(), want) {
			t.Errorf("%s -> %s through the client:\n%s\nwant, from the objects themselves:\n%s", q.Src, q.Dst, out.Bytes(), want)
		}
	}
	err := TraceCommand(context.Background(), c, TraceInput{Src: "client", Dst: "ghost"}, &bytes.Buffer{})
	if err == nil || err.Error() != "pod or service default/ghost not found" {
		t.Errorf("unknown pod through the client: %v", err)
	}
}
