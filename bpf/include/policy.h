/* Kubernetes NetworkPolicy, decided per packet of a flow's opening side.
 *
 * The agent compiles the policies that select this node's pods
 * (internal/netpol) into three tables, and this header decides with them:
 * - lace_pol_eps: a pod's port (host-side ifindex) -> the directions
 *   some policy has a say in (a NetworkPolicy isolating it, or a
 *   ClusterNetworkPolicy rule selecting it), those where a NetworkPolicy
 *   isolates it (a packet no verdict names is refused), and the policy
 *   such a refusal is counted on. A port absent here, or without a say
 *   in the direction, is not looked further: an unpolicied pod costs one
 *   hash lookup.
 * - lace_pol_peers (a pod's address in its network, exact) and
 *   lace_pol_cidrs (any address, longest prefix): the peer's class, the
 *   set of policy peers (selectors, ipBlocks, named ports) it matches.
 *   A pod address is found in its own network only, so overlapping
 *   addresses of two networks are never confused; a pod's class already
 *   holds the ipBlocks its address lies in.
 * - lace_pol: (port, class, direction, protocol, destination port) ->
 *   allowed or denied, and by which policy's rule, by longest prefix (a
 *   port range is a few prefixes). The agent composes the tiers
 *   (ClusterNetworkPolicy admin, NetworkPolicy, baseline) before: one
 *   lookup decides.
 *
 * What is decided: every packet the pod's side did not answer. A reply
 * (conntrack holds the flow as opened by the other side) is the flow
 * the other side's decision admitted. A packet of an open flow is
 * decided again, so a policy removed or narrowed takes the flows it no
 * longer allows with it at once. */
#ifndef LACE_POLICY_H
#define LACE_POLICY_H

#define POL_IN 1
#define POL_OUT 2

#include "flows.h"

/* pol_ep_val.flags: POL_IN and POL_OUT say the verdicts have a say in
 * the direction; POL_ISOLATED(dir) that a miss there is refused. */
#define POL_ISOLATED(dir) ((dir) << 2)

struct pol_ep_val {
	__u32 flags;
	__u32 deny_in;  /* policy id a denied inbound packet is counted on */
	__u32 deny_out;
};

struct pol_peer_key {
	__u32 net_id;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct pol_cidr_key {
	__u32 prefixlen; /* 8 + the address bits */
	__u8 family;
	__u8 addr[16];
};

/* Compared as bytes in this order by the trie: the port, class,
 * direction, protocol (TCP, UDP or SCTP; 0 for any other, with port 0)
 * and destination port (network order). prefixlen 72 covers every
 * protocol, 80 every port of one, 80 + k a port range's aligned block. */
struct pol_key {
	__u32 prefixlen;
	__u32 ifindex;
	__u32 class;
	__u8 dir;
	__u8 proto;
	__u16 port;
};
#define POL_KEY_BITS 96

struct pol_val {
	__u32 policy; /* the policy whose rule decides */
	__u16 rule;
	__u8 allow;
	__u8 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct pol_ep_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_pol_eps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, struct pol_peer_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_pol_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__type(key, struct pol_cidr_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_pol_cidrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 524288);
	__type(key, struct pol_key);
	__type(value, struct pol_val);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_pol SEC(".maps");

/* Drops per policy id (the agent names them: lace_policy_drops_total). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_pol_drops SEC(".maps");

/* pol_denied tells whether the policies of the pod at port ifindex refuse
 * packet p in direction dir (POL_IN: p comes from its source in network
 * peer_net; POL_OUT: p goes to its destination in peer_net), counting the
 * drop on the deciding policy. A global function: verified once, however
 * many paths reach it. */
__noinline int pol_denied(__u32 ifindex, __u32 dir, __u32 peer_net, struct pkt *p)
{
	if (!p)
		return 0;
	struct pol_ep_val *ep = bpf_map_lookup_elem(&lace_pol_eps, &ifindex);
	if (!ep || !(ep->flags & dir))
		return 0;
	__u32 deny = dir == POL_IN ? ep->deny_in : ep->deny_out;

	/* One room for every key, used in turn: the stack of the calls that
	 * reach here is nearly all spent. */
	union {
		struct pol_peer_key pk;
		struct pol_cidr_key ck;
		struct pol_key k;
		__u64 one;
	} u;
	__builtin_memset(&u, 0, sizeof(u));
	__u8 fam = p->family;
	const __u8 *addr = dir == POL_IN ? p->saddr : p->daddr;
	u.pk.net_id = peer_net;
	u.pk.family = fam;
	__builtin_memcpy(u.pk.addr, addr, 16);
	__u32 class = 0;
	__u32 *c = bpf_map_lookup_elem(&lace_pol_peers, &u.pk);
	if (c) {
		class = *c;
	} else {
		u.ck.prefixlen = 8 + (fam == LACE_FAMILY_V4 ? 32 : 128);
		u.ck.family = fam;
		__builtin_memcpy(u.ck.addr, addr, 16);
		c = bpf_map_lookup_elem(&lace_pol_cidrs, &u.ck);
		if (c)
			class = *c;
	}

	int ports = p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP || p->proto == IPPROTO_SCTP;
	/* A protocol behind IPv6 extension headers (parsing stops at the
	 * first) cannot be told from another: where a policy has a say, it
	 * is refused, as no rule could be matched to it. */
	int hidden = p->family == LACE_FAMILY_V6 && ipv6_ext_header(p->proto);
	u.k.prefixlen = POL_KEY_BITS;
	u.k.ifindex = ifindex;
	u.k.class = class;
	u.k.dir = dir;
	u.k.proto = ports ? p->proto : 0;
	u.k.port = ports ? p->dport : 0;
	struct pol_val *v = hidden ? NULL : bpf_map_lookup_elem(&lace_pol, &u.k);
	if (v && v->allow)
		return 0;
	if (v)
		deny = v->policy;
	else if (!hidden && !(ep->flags & POL_ISOLATED(dir)))
		return 0;
	__u64 *n = bpf_map_lookup_elem(&lace_pol_drops, &deny);
	if (n) {
		*n += 1; /* per CPU */
	} else {
		u.one = 1;
		bpf_map_update_elem(&lace_pol_drops, &deny, &u.one, BPF_NOEXIST);
	}
	/* The pod's own network is its port's (the agent knows it). */
	flow_tell(p, dir == POL_IN ? flow_nets(peer_net, 0) : flow_nets(0, peer_net), ifindex,
		  FLOW_DROPPED | (DROP_POLICY << 8) | (dir << 16) | ((__u64)deny << 32));
	return 1;
}

#endif
