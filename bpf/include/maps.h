/* The map layout shared with Go: the structs of every pinned map's keys
 * and values and the maps themselves. internal/datapath mirrors them
 * through bpf2go (-type in gen.go) and writes them; a change of a struct
 * here is a change of what an upgraded agent finds pinned (layout.go).
 *
 * Every map is pinned by name so the pod, underlay and socket programs
 * share one instance, and an agent restart finds the state it left. Keys
 * carry the network ID so networks may use overlapping subnets.
 * Included by lace.h, after the drop reasons whose count sizes lace_drops. */
#ifndef LACE_MAPS_H
#define LACE_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

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
	/* The key of lb_flow_hash (the agent draws it once and keeps it in
	 * the pinned map): a tenant cannot tell which source port lands on
	 * which endpoint. */
	__u64 flow_key[2];
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
/* A port of an l2 network: from_l2 takes its frames (l2.c) and hands
 * from_pod those it routes. */
#define PORT_L2 8
/* A port of an l2 network that learns (spec.l2.learning): a source MAC or
 * address it sends that the network does not know is reported to the agent
 * (lace_l2_learn, l2.c), which publishes it through lace-controller. */
#define PORT_L2_LEARN 16

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
 * ingress address or an ExternalIP (underlay.c, xlb_in). Its service's ClusterIP and
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

/* Flow events (flows.h): on while someone listens, at most per_sec a
 * second on each CPU. Here, not in flows.h: drop() reads it. */
struct flow_cfg {
	__u32 on;
	__u32 per_sec;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct flow_cfg);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_flow_cfg SEC(".maps");

/* The reason drop() noted for the packet being handled, plus one (0:
 * none), on this CPU: a program runs to its end on one CPU. Not pinned:
 * it lives for one run. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} lace_drop_note SEC(".maps");

#endif
