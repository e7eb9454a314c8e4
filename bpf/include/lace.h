/* Shared definitions of Lace's eBPF data plane: map layouts (mirrored by
 * internal/datapath through bpf2go), drop reasons and small helpers.
 *
 * Every map is pinned by name so the pod and underlay programs share one
 * instance, and an agent restart finds the state it left. Keys carry the
 * network ID so networks may use overlapping subnets. */
#ifndef LACE_H
#define LACE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/icmpv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

/* Debian's UAPI headers predate these flags; the values are the kernel's
 * (internal/datapath checks them against the running kernel's BTF). */
#define LACE_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define LACE_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)

#define AF_INET 2
#define AF_INET6 10
#define LACE_FAMILY_V4 4
#define LACE_FAMILY_V6 6

/* SID function layout, in the 64 bits after a node's /64 locator:
 * byte 8 is the behaviour, bytes 10-11 the source network ID (the context
 * the flow comes from: the receiving node records it in conntrack and
 * sends replies back in it), bytes 12-15 the destination network ID (big
 * endian). */
#define SID_BEHAVIOUR_BYTE 8
#define SID_SRC_NET_BYTE 10
#define SID_NET_BYTE 12
#define SID_L3_DECAP 1 /* End.DT46: decapsulate, look up in network N */
/* The nodes' own context: a network ID no Network is given (the controller
 * stops one short). A SID naming it carries a flow between a node's
 * address and a pod, the external frontends' translated flows: its view
 * holds the other nodes' addresses, and a packet decapsulated in it is the
 * answer to a flow that node translated (xlb.h). */
#define NODE_NET_ID 0xffff

/* Drop reasons and forwarding counters. The comment of each is its name
 * and meaning as operators see them (metrics, lacectl): internal/datapath
 * generates its tables from these lines (go generate), so C and Go cannot
 * disagree. Keep the form NAME = N, / * name: meaning * /. */
enum drop_reason {
	DROP_NOT_IP = 0, /* link-local: not IP, or ND, MLD or a link-local source from a pod */
	DROP_SPOOF = 1, /* spoofed-source: the source address is not the pod's */
	DROP_ISOLATED = 2, /* isolated: the destination is in no network the source's view holds */
	DROP_ANONYMOUS = 3, /* anonymous-network: an anonymous network without a self policy */
	DROP_NO_ENDPOINT = 4, /* no-endpoint: inside a local block but no such pod */
	DROP_TTL = 5, /* ttl-exceeded: TTL or hop limit exhausted */
	DROP_FIB = 6, /* no-underlay-route: no underlay route to the SID */
	DROP_HOST = 7, /* to-node-not-answer: pod to node traffic that is not an answer */
	DROP_DECAP_SOURCE = 8, /* decap-unknown-source: SRv6 from an address that is no node's */
	DROP_DECAP_SID = 9, /* decap-unknown-sid: the SID names no known network or behaviour */
	DROP_DECAP_PROTO = 10, /* decap-bad-protocol: the SID packet carries neither IPv4 nor IPv6 */
	DROP_ADJUST = 11, /* header-adjust-failed: changing header room failed */
	DROP_UNKNOWN_PORT = 12, /* unknown-port: a pod port without endpoint state */
	DROP_NOT_LOCAL = 13, /* not-for-this-node: plain IP from the underlay to an outside address: a node is no router */
	DROP_DECAP_TRUNCATED = 14, /* decap-truncated: an SRv6 packet too short for its inner header */
	DROP_DECAP_EXT_HEADER = 15, /* decap-extension-header: an SRv6 packet with an IPv6 extension header */
	DROP_DECAP_FRAGMENT = 16, /* decap-fragment: a fragmented SRv6 packet */
	DROP_MTU = 17, /* too-big: larger than the underlay carries; the sender got ICMP fragmentation-needed or packet-too-big */
	DROP_UNCLASSIFIED = 18, /* unclassified-source: plain IP from a source no external network's prefix covers */
	DROP_SNAT = 19, /* snat-failed: no free SNAT port on the node toward this destination */
	DROP_NO_SERVICE_PORT = 20, /* no-service-port: a VIP on a port no service serves (rejected: ICMP port unreachable) */
	DROP_NO_BACKEND = 21, /* no-endpoints: a service without endpoints (rejected: ICMP port unreachable) */
	DROP_NO_LOCAL_BACKEND = 22, /* no-local-endpoints: internalTrafficPolicy Local and no endpoint on this node */
	DROP_FRONTEND_CLOSED = 23, /* frontend-closed: a NodePort on a node address whose external network no policy opens to the service's network */
	DROP_SOURCE_RANGE = 24, /* source-range: a source outside the service's loadBalancerSourceRanges */
	DROP_SNAT_CLOSED = 25, /* snat-closed: to a node SNAT port whose pod flow is over (its conntrack entry expired, was evicted or gave the port up) */
	DROP_NO_FLOW = 26, /* no-flow: a TCP segment that is no SYN toward an outside address, of no flow the node tracks (an answer to a flow that is over): it takes no SNAT port */
	DROP_OUTSIDE_SPOOF = 27, /* outside-spoofed-source: plain IP from the fabric with a source inside the cluster (a pod subnet, a service range, a node's locator) */
	DROP_CT_OTHER_NET = 28, /* flow-of-another-network: a packet whose tuple is a live flow of another network: it neither refreshes nor takes that flow */
	DROP_ICMP_NOT_OURS = 29, /* icmp-error-no-flow: an ICMP error from a pod about no flow conntrack holds for it with that peer */
	DROP_NODE_FORGED = 30, /* node-forged-underlay: the node's own stack sent SRv6 to a locator, or a packet from another node's address: only Lace's encapsulation speaks for the node */
	DROP_DECAP_FOREIGN = 31, /* decap-foreign-source: SRv6 whose inner source is a pod of a block the sending node does not own */
	DROP_FRAGMENT = 32, /* fragment: retired: a later fragment now takes its first fragment's ports (frag.h); see fragment-before-first */
	DROP_FRAG_NO_FIRST = 33, /* fragment-before-first: a later IP fragment whose first fragment (with the ports) was not seen: out of order, lost, forged, or of another network */
	DROP_ICMP_IN_NOT_OURS = 34, /* icmp-error-in-no-flow: an ICMP error toward a pod about no live flow of that pod whose peer is the error's sender (its network, or outside for an outside flow) */
	DROP_MAX = 35,
};

enum fwd_counter {
	FWD_LOCAL = 0, /* local: delivered to a pod on this node */
	FWD_ENCAP = 1, /* encapsulated: encapsulated to another node */
	FWD_DECAP = 2, /* decapsulated: decapsulated and delivered */
	FWD_HOST = 3, /* to-host: a reply handed to the host */
	FWD_ICMP_ERROR = 4, /* icmp-error: an ICMP error sent back to a pod (time exceeded, too big) */
	FWD_SNAT = 5, /* to-external: a pod's flow sent to an external network with the node's address */
	FWD_FROM_EXTERNAL = 6, /* from-external: outside traffic (or an SNAT reply) delivered or forwarded to a pod */
	FWD_REPLY_OUT = 7, /* reply-out: a pod's reply to an outside source, sent from the pod's address */
	FWD_SERVICE = 8, /* to-service: a new flow to a service VIP translated to an endpoint */
	FWD_ANNOUNCE = 9, /* announced: an ARP or neighbour solicitation for a LoadBalancer VIP this node announces, answered */
	FWD_MAX = 10,
};

/* skb->mark of what Lace's own encapsulation sends (encap_and_send):
 * to_underlay lets only such packets reach another node's locator, and
 * only from this node's own address. The mark is no secret: SO_MARK needs
 * only CAP_NET_RAW since Linux 5.17 (docs/security.md section 8). The
 * value keeps clear of kube-proxy's 0x4000/0x8000 bits and Cilium's
 * 0x0F00 nibble, so neither reads our packets as theirs. */
#define LACE_MARK_ENCAP 0x1ace0001

/* lace_config.flags */
#define LACE_CFG_UNDERLAY_GUARD (1U << 0) /* lace_host_addrs is complete: drop plain IP to anything else */
#define LACE_CFG_HAS_V4 (1U << 1)         /* underlay_ip4 is set */

struct lace_config {
	__u8 underlay_ip6[16]; /* outer source address; source of ICMPv6 errors */
	__u8 locator[8];       /* this node's /64 locator */
	__u32 underlay_ifindex;
	__u32 flags;
	__u8 underlay_ip4[4]; /* source of ICMP errors the node sends */
	/* The node's own sockets (connect-time service translation): the
	 * host network namespace, and the networks its addresses classify
	 * into (whose views say which VIPs the node reaches). */
	__u32 host_net4;
	__u32 host_net6;
	__u32 pad;
	__u64 host_netns;
};

struct ep_key {
	__u32 net_id;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct ep_val {
	__u32 ifindex; /* host side of the pod's veth */
	__u8 pod_mac[6];
	__u8 host_mac[6];
	__u32 flags;
};

struct port_val { /* keyed by the host-side ifindex */
	__u32 net_id;
	__u32 flags;
	__u8 ip4[4];
	__u8 ip6[16];
};
#define PORT_HAS_V4 1
#define PORT_HAS_V6 2
/* The pod's network namespace is in lace_pod_netns: its TCP connects to
 * a VIP pass the socket hooks, which take the hairpin choice (sock.c).
 * (The cookie is not in port_val, whose size pinned maps keep across
 * upgrades.) */
#define PORT_SOCK_LB 4

/* A pod's network namespace (its cookie) -> its port (host-side ifindex):
 * how the socket hooks tell a pod's sockets and find the pod. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_pod_netns SEC(".maps");

struct route_key {
	__u32 prefixlen; /* 64 + prefix length */
	__u32 net_id;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct route_val {
	__u8 sid[16];
	__u32 flags;
	__u32 dst_net; /* the network the prefix belongs to */
};
/* route_val.flags; no kind flag: a block on another node, encapsulate */
#define ROUTE_LOCAL 1    /* a block of this node: deliver, never encapsulate */
#define ROUTE_SUBNET 2   /* a pod subnet outside any block: no such pod */
#define ROUTE_EXTERNAL 4 /* an external network: SNAT out from a pod, transit from the underlay */
#define ROUTE_DENY 8     /* an external network's prefix outside the view */
#define ROUTE_CLOSED 16  /* an anonymous network's own entry without self policy: replies only */
#define ROUTE_SERVICE 32 /* a service VIP (/32, /128) the view reaches; dst_net is the service's network */

/* lace_classify: external prefixes, for plain-IP sources. */
struct class_key {
	__u32 prefixlen; /* 32 + prefix length */
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

/* lace_inside: what lies inside the cluster (the subnets of pod
 * networks, the service ranges, the nodes' locators), keyed like
 * lace_classify. No outside host has such an address: plain IP from the
 * fabric with a source here is spoofed (underlay.c, outside_spoofed). The
 * value is the kind, for operators' listings. */
#define INSIDE_POD_SUBNET 1
#define INSIDE_SERVICE_RANGE 2
#define INSIDE_LOCATOR 3

struct net_val {
	__u32 flags;
};
#define NET_ANONYMOUS 1

struct host_key {
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lace_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct ep_key);
	__type(value, struct ep_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct port_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144);
	__type(key, struct route_key);
	__type(value, struct route_val);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_routes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct net_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_networks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16384);
	__type(key, struct class_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_classify SEC(".maps");

/* Services: a VIP, protocol and port -> its endpoints eligible on this
 * node, in lace_backends at (id, 0..count-1). The agent writes a changed
 * service's backends before its count, so a reader never sees an index
 * without a backend. */
struct svc_key {
	__u8 family;
	__u8 proto;
	__u16 port; /* network order */
	__u8 vip[16];
};

struct svc_val {
	__u32 id;
	__u32 net_id; /* the service's network: endpoints are reached in it */
	__u16 count;
	__u16 flags;
	__u32 affinity; /* ClientIP affinity timeout in seconds; 0 for none */
};
#define SVC_DROP 1 /* no eligible backend here: drop, do not reject */
/* An external frontend: a NodePort on a node address, a LoadBalancer
 * ingress address or an ExternalIP (xlb.h). Its service's ClusterIP and
 * port are the backend at BACKEND_CLUSTER_REF: who may reach the frontend
 * is who may reach that ClusterIP. */
#define SVC_EXTERNAL 2
#define SVC_SNAT 4        /* externalTrafficPolicy Cluster: a remote backend sees the node's address */
#define SVC_LOCAL 8       /* externalTrafficPolicy Local: in-cluster clients use the ClusterIP's backends */
#define SVC_CLOSED 16     /* a NodePort no policy opens on this node address: dropped */
#define SVC_SRC_RANGES 32 /* loadBalancerSourceRanges: lace_src_ranges lists the admitted sources */
#define SVC_KIND_SHIFT 6 /* bits 6-8: the frontend's kind (NodePort, LoadBalancer, ExternalIP, HostPort), for the agent's views */
#define SVC_KIND_MASK 7
#define SVC_KIND_EXTERNAL_IP 3 /* tables.FrontendExternalIP */
/* A pod's hostPort on a node address (or loopback, for the node's own
 * sockets only): its one backend is the pod, and BACKEND_CLUSTER_REF holds
 * the pod's address and container port. Who may reach it is who may reach
 * that pod (a view routing the address to the pod's network, a block of
 * this node), as a NodePort is who may reach its ClusterIP. */
#define SVC_KIND_HOSTPORT 4 /* tables.FrontendHostPort */
#define BACKEND_CLUSTER_REF 0xffffffff

struct backend_key {
	__u32 id;
	__u32 index;
};

struct backend_val {
	__u8 addr[16];
	__u16 port; /* network order */
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct svc_key);
	__type(value, struct svc_val);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_services SEC(".maps");

/* ClientIP session affinity: a client's endpoint per service, until
 * expires (bpf_ktime_get_ns), renewed by each new flow. */
struct affinity_key {
	__u32 id;
	__u8 family;
	__u8 pad[3];
	__u8 client[16];
};

struct affinity_val {
	__u64 expires;
	__u8 addr[16];
	__u16 port;
	__u16 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct affinity_key);
	__type(value, struct affinity_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, struct backend_key);
	__type(value, struct backend_val);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_backends SEC(".maps");

/* loadBalancerSourceRanges: (service ID, source prefix) -> 1. */
struct src_range_key {
	__u32 prefixlen; /* 64 + prefix length */
	__u32 id;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__type(key, struct src_range_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_src_ranges SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16384);
	__type(key, struct class_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_inside SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct host_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_nodes SEC(".maps"); /* underlay addresses of every node */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct host_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_host_addrs SEC(".maps"); /* this node's own addresses */

/* A node's underlay address -> its /64 locator (the first 8 bytes, as a
 * __u64 in memory order): decap checks that a pod source comes from the
 * node owning its block. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct host_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_node_locs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	/* Room beyond DROP_MAX: a pinned map's size must not change when a
	 * reason is added, or an upgraded agent could not load it. */
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 32); /* room beyond FWD_MAX, as lace_drops */
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_forwarded SEC(".maps");

static __always_inline int drop(__u32 reason)
{
	__u64 *c = bpf_map_lookup_elem(&lace_drops, &reason);
	if (c)
		*c += 1;
	return TC_ACT_SHOT;
}

static __always_inline void count(__u32 what)
{
	__u64 *c = bpf_map_lookup_elem(&lace_forwarded, &what);
	if (c)
		*c += 1;
}

static __always_inline struct lace_config *config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&lace_cfg, &zero);
}

/* A parsed IP packet: family, addresses as 16 bytes (IPv4 in the first 4),
 * L4 protocol and ports (ICMP: zero). */
struct pkt {
	__u8 family;
	__u8 proto;
	__u8 ttl;
	__u8 tos; /* IPv4 TOS or IPv6 traffic class: DSCP and ECN */
	__u16 sport; /* ICMP echo: the identifier, in both */
	__u16 dport;
	__u8 tcp_flags;
	__u8 icmp_type; /* ICMP and ICMPv6 */
	__u8 frag; /* PKT_FRAG_FIRST or PKT_FRAG_LATER (no L4 header: ports from frag.h) */
	__u8 pad;
	__u8 saddr[16];
	__u8 daddr[16];
	__u32 l3_off;
	__u32 l4_off;
	/* One word for two uses that never meet (the stack is tight): a
	 * fragment's ID is read by frag_track right after parsing, the MTU
	 * is set only with RET_TOO_BIG, when the packet is done with. */
	union {
		__u32 mtu; /* with RET_TOO_BIG: what the sender may send */
		__u32 frag_id; /* a fragment's IP ID (IPv4: 16 bits; IPv6: the fragment header's 32), network order */
	};
};
/* pkt.frag: the first fragment (offset 0, more to come) has the L4
 * header; a later one carries payload where a header would be: its ports
 * come from the first (frag.h), and nothing of its payload is rewritten. */
#define PKT_FRAG_LATER 1
#define PKT_FRAG_FIRST 2
#define IPV6_FRAGMENT 44

/* A forwarding function's answer that the packet needs an ICMP error
 * (too big), sent by the program itself so that the error's large stack
 * frame never adds to the deepest call chain. Not a TC action. */
#define RET_TOO_BIG 0x7000
/* The packet's destination answers ICMP port unreachable (a service port
 * without endpoints), sent by the program as RET_TOO_BIG is. */
#define RET_PORT_UNREACH 0x7001

/* is_echo tells whether an ICMP or ICMPv6 type is an echo request or
 * reply, whose identifier conntrack and SNAT treat as a port. */
static __always_inline int is_echo(__u8 proto, __u8 type)
{
	if (proto == IPPROTO_ICMP)
		return type == 8 || type == 0;
	return type == 128 || type == 129;
}

static __always_inline int parse_l4(struct __sk_buff *skb, struct pkt *p, __u32 l4_off)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP) {
		__u16 *ports = data + l4_off;
		if ((void *)(ports + 2) > end)
			return -1;
		p->sport = ports[0];
		p->dport = ports[1];
		if (p->proto == IPPROTO_TCP) {
			/* A first fragment holds the whole TCP header, or its
			 * flags (a SYN) would come in a later one unseen (RFC
			 * 1858's tiny fragment; no stack cuts a header). */
			if (p->frag == PKT_FRAG_FIRST && data + l4_off + sizeof(struct tcphdr) > end)
				return -1;
			__u8 *fl = data + l4_off + 13;
			if ((void *)(fl + 1) <= end)
				p->tcp_flags = *fl;
		}
	} else if (p->proto == IPPROTO_ICMP || p->proto == IPPROTO_ICMPV6) {
		__u8 *icmp = data + l4_off;
		if ((void *)(icmp + 8) > end)
			return -1;
		p->icmp_type = icmp[0];
		if (is_echo(p->proto, icmp[0])) {
			p->sport = *(__u16 *)(icmp + 4);
			p->dport = p->sport;
		}
	}
	return 0;
}

/* parse fills p from the IP header at l3_off; eth_proto is network order. */
static __always_inline int parse_ip(struct __sk_buff *skb, __u16 eth_proto, __u32 l3_off, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	p->l3_off = l3_off;
	if (eth_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data + l3_off;
		if ((void *)(ip + 1) > end)
			return -1;
		p->family = LACE_FAMILY_V4;
		p->proto = ip->protocol;
		p->ttl = ip->ttl;
		p->tos = ip->tos;
		__builtin_memcpy(p->saddr, &ip->saddr, 4);
		__builtin_memcpy(p->daddr, &ip->daddr, 4);
		p->l4_off = l3_off + ip->ihl * 4;
		/* A later fragment carries payload where a header would be:
		 * read as ports, it would be translated (and its bytes
		 * rewritten). It has none: frag_track gives it the first's. */
		p->frag_id = ip->id;
		if (ip->frag_off & bpf_htons(0x1fff)) {
			p->frag = PKT_FRAG_LATER;
			return 0;
		}
		if (ip->frag_off & bpf_htons(0x2000))
			p->frag = PKT_FRAG_FIRST;
		return parse_l4(skb, p, p->l4_off);
	}
	if (eth_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + l3_off;
		if ((void *)(ip6 + 1) > end)
			return -1;
		p->family = LACE_FAMILY_V6;
		p->proto = ip6->nexthdr;
		p->ttl = ip6->hop_limit;
		p->tos = (ip6->priority << 4) | (ip6->flow_lbl[0] >> 4);
		__builtin_memcpy(p->saddr, &ip6->saddr, 16);
		__builtin_memcpy(p->daddr, &ip6->daddr, 16);
		p->l4_off = l3_off + sizeof(*ip6);
		/* A fragment header right after the fixed one (what a host's
		 * stack sends for a datagram larger than the MTU): the L4
		 * protocol is its next header, the L4 header follows it in the
		 * first fragment only. */
		if (p->proto == IPV6_FRAGMENT) {
			__u8 *fh = data + p->l4_off;
			if ((void *)(fh + 8) > end)
				return -1;
			p->proto = fh[0];
			p->l4_off += 8;
			__builtin_memcpy(&p->frag_id, fh + 4, 4);
			__u16 off = ((__u16)fh[2] << 8) | fh[3];
			if (off & 0xfff8) {
				p->frag = PKT_FRAG_LATER;
				return 0;
			}
			if (off & 1)
				p->frag = PKT_FRAG_FIRST;
		}
		return parse_l4(skb, p, p->l4_off);
	}
	return -1;
}

/* dec_ttl lowers the TTL / hop limit of the IP header at l3_off by one. */
static __always_inline int dec_ttl(struct __sk_buff *skb, struct pkt *p)
{
	if (p->family == LACE_FAMILY_V4) {
		__u32 off = p->l3_off + offsetof(struct iphdr, ttl);
		/* TTL and protocol share one 16-bit checksum word. */
		__u16 old = bpf_htons(((__u16)p->ttl << 8) | p->proto);
		__u16 new = bpf_htons(((__u16)(p->ttl - 1) << 8) | p->proto);
		__u8 ttl = p->ttl - 1;
		if (bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check), old, new, 2))
			return -1;
		return bpf_skb_store_bytes(skb, off, &ttl, 1, 0);
	}
	__u8 hl = p->ttl - 1;
	return bpf_skb_store_bytes(skb, p->l3_off + offsetof(struct ipv6hdr, hop_limit), &hl, 1, 0);
}

/* eq4/eq8/eq16 compare addresses without a memcmp libcall. */
static __always_inline int eq4(const void *a, const void *b)
{
	return *(const __u32 *)a == *(const __u32 *)b;
}

static __always_inline int eq8(const void *a, const void *b)
{
	const __u32 *x = a, *y = b;
	return x[0] == y[0] && x[1] == y[1];
}

static __always_inline int eq16(const void *a, const void *b)
{
	const __u32 *x = a, *y = b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u64 s = (__u64)sum;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return ~(__u16)s;
}

static __always_inline int set_macs(struct __sk_buff *skb, const __u8 *dst, const __u8 *src)
{
	if (bpf_skb_store_bytes(skb, 0, dst, 6, 0))
		return -1;
	return bpf_skb_store_bytes(skb, 6, src, 6, 0);
}

#endif
