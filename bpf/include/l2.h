/* The maps of l2 networks: the neighbour table (address -> MAC) an l2
 * port's address resolution is answered from, the forwarding database
 * (MAC -> where), and the jump to the routing program (shared with Go,
 * internal/datapath/l2.go); and what both ends of a switched frame do
 * alike (l2_unnat). */
#ifndef LACE_L2_H
#define LACE_L2_H

#include "lace.h"
#include "fwd.h"

struct l2_neigh_key {
	__u32 net_id;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct l2_neigh_val {
	__u8 mac[6];
	__u16 flags;
};
/* The network's gateway: its advertisement carries the router flag. */
#define NEIGH_ROUTER 1

struct fdb_key {
	__u32 net_id;
	__u8 mac[6];
	__u16 pad;
};

struct fdb_val {
	__u32 ifindex; /* FDB_LOCAL: the port's host side */
	__u32 flags;
	__u32 seq;     /* the MAC's move sequence (RFC 7432 section 15) */
	__u32 pad;
	__u8 sid[16];  /* FDB_REMOTE: the node's SID for the network's frames */
};
#define FDB_LOCAL 1
/* The anycast gateway's MAC, the same on every node: what is sent to it
 * is routed (from_pod). */
#define FDB_GATEWAY 2
#define FDB_REMOTE 4

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct l2_neigh_key);
	__type(value, struct l2_neigh_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_l2_neigh SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct fdb_key);
	__type(value, struct fdb_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_fdb SEC(".maps");

/* Slot 0: from_pod, where a frame to the gateway MAC continues. The agent
 * sets it after loading both programs. */
#define L2_JUMP_ROUTE 0

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_l2_jump SEC(".maps");

/* Flooding: per network, the ports on this node (lace_l2_flood entries
 * 0..nlocal-1: host-side ifindexes) and the other nodes with ports in it
 * (entries L2_FLOOD_MAX..L2_FLOOD_MAX+nremote-1: their DT2M SIDs), counted
 * in lace_l2_nets. */
#define L2_FLOOD_MAX 128

struct l2_flood_key {
	__u32 net_id;
	__u32 idx;
};

struct l2_flood_val {
	__u32 ifindex;
	__u32 pad;
	__u8 sid[16];
};

struct l2_net_val {
	__u32 nlocal;
	__u32 nremote;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct l2_flood_key);
	__type(value, struct l2_flood_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_l2_flood SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct l2_net_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_l2_nets SEC(".maps");

/* l2_flood_local copies the frame to the network's ports on this node but
 * skip (the port it came from). Bounded: the verifier walks it once per
 * iteration, L2_FLOOD_MAX at most. */
static __always_inline void l2_flood_local(struct __sk_buff *skb, __u32 net_id, __u32 skip)
{
	struct l2_net_val *nv = bpf_map_lookup_elem(&lace_l2_nets, &net_id);
	if (!nv)
		return;
	__u32 n = nv->nlocal;
	for (__u32 i = 0; i < L2_FLOOD_MAX; i++) {
		if (i >= n)
			break;
		struct l2_flood_key k = {.net_id = net_id, .idx = i};
		struct l2_flood_val *v = bpf_map_lookup_elem(&lace_l2_flood, &k);
		if (v && v->ifindex != skip)
			bpf_clone_redirect(skb, v->ifindex, 0);
	}
}

/* l2_unnat: a switched frame may be a Service endpoint's answer to a
 * client of its segment whose flow was translated (the client sent to the
 * VIP through the gateway, where from_pod translated it; the endpoint
 * answers the client directly, on-link). It must leave from the VIP, and
 * the client's flow must see the answer (its handshake settles), as on
 * the routed path. p is the frame's IP packet after the Ethernet header.
 * Only looked up: switched flows are not tracked. -1: the rewrite failed. */
static __noinline __attribute__((unused)) int l2_unnat(struct __sk_buff *skb, struct pkt *p, __u32 net_id)
{
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return 0;
	struct ct_key k;
	ct_key_of(&k, net_id, p, 0);
	struct ct_val *v = ct_lookup(&k);
	if (!v || (v->flags & (CT_DNAT | CT_ORIGIN_LOCAL)) != (CT_DNAT | CT_ORIGIN_LOCAL) || v->peer_net != net_id)
		return 0;
	v = ct_update(&k, v, p, 0);
	return unnat_reply(skb, p, v) ? -1 : 0;
}

#endif
