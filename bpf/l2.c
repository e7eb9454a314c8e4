/* from_l2: the tc ingress of an l2 port's host side, that is everything a
 * pod (or the VM behind it) of an l2 network sends. An l2 network is one
 * Ethernet segment: frames are switched by destination MAC through the
 * forwarding database (lace_fdb), and address resolution never floods: an
 * ARP request or neighbour solicitation is answered here from the
 * network's neighbour table (lace_l2_neigh), which holds every address the
 * network knows, the anycast gateway's included. A frame to the gateway's
 * MAC is routed: it continues in from_pod (tail call), which treats it as
 * an l3 pod's packet (views, conntrack, services, SNAT).
 *
 * Every frame is checked against the port first: its source MAC must be
 * the port's (lace_fdb says which port holds a MAC), its source address
 * the port's. On a learning network (PORT_L2_LEARN) an address is also
 * the port's when the network's neighbour table binds it to the frame's
 * source MAC; a source MAC or address the network does not know is
 * reported to the agent (l2_learn) and the frame dropped until the binding
 * is published. This program owns no map; l2.h describes the ones it
 * reads and the learning ring it writes. */
#include "lace.h"
#include "fwd.h"
#include "neigh.h"
#include "l2.h"

static __always_inline int link_local6(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

static __always_inline struct l2_neigh_val *neigh_of(__u32 net_id, __u8 family, const __u8 *addr)
{
	struct l2_neigh_key k = {.net_id = net_id, .family = family};
	if (family == LACE_FAMILY_V4)
		__builtin_memcpy(k.addr, addr, 4);
	else
		__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&lace_l2_neigh, &k);
}

/* The port an l2 frame comes from, as the subprograms need it. */
struct l2_port {
	__u32 net_id;
	__u32 flags;
	__u8 ip4[4];
	__u8 ip6[16];
};

/* src_addr_ok tells whether addr (family's) may be the source of a frame
 * from port pt with source MAC smac (already known to live at the port):
 * the port's own address, or on a learning port one its network binds to
 * smac. */
static __always_inline int src_addr_ok(const struct l2_port *pt, __u8 family, const __u8 *addr, const __u8 *smac)
{
	if (family == LACE_FAMILY_V4 && (pt->flags & PORT_HAS_V4) && eq4(addr, pt->ip4))
		return 1;
	if (family == LACE_FAMILY_V6 && (pt->flags & PORT_HAS_V6) && eq16(addr, pt->ip6))
		return 1;
	if (!(pt->flags & PORT_L2_LEARN))
		return 0;
	struct l2_neigh_val *n = neigh_of(pt->net_id, family, addr);
	return n && mac_eq(n->mac, smac);
}

/* l2_learn reports a source MAC (and address, family not 0) port ifindex
 * sent that its network does not know, at most once per L2_LEARN_GAP_NS
 * per port, and drops the frame: it goes through once the agent had the
 * binding published. */
static __noinline int l2_learn(__u32 ifindex, __u32 net_id, const __u8 *mac, __u8 family, const __u8 *addr)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 *last = bpf_map_lookup_elem(&lace_l2_learn_gap, &ifindex);
	if (last && now - *last < L2_LEARN_GAP_NS)
		return drop(DROP_L2_LEARNING);
	bpf_map_update_elem(&lace_l2_learn_gap, &ifindex, &now, BPF_ANY);
	struct l2_learn_event *e = bpf_ringbuf_reserve(&lace_l2_learn, sizeof(*e), 0);
	if (e) {
		__builtin_memset(e, 0, sizeof(*e));
		e->ifindex = ifindex;
		e->net_id = net_id;
		__builtin_memcpy(e->mac, mac, 6);
		e->family = family;
		if (family)
			__builtin_memcpy(e->addr, addr, 16);
		bpf_ringbuf_submit(e, 0);
	}
	return drop(DROP_L2_LEARNING);
}

/* l2_bad_source drops a frame whose source address is not the port's
 * (src_addr_ok): reported for learning on a learning port, spoofed
 * elsewhere. */
static __always_inline int l2_bad_source(__u32 ifindex, const struct l2_port *pt, const __u8 *mac, __u8 family, const __u8 *addr)
{
	/* An unspecified or link-local source is never learned: reporting
	 * it would only spend the port's report on nothing (DHCP, mDNS). */
	int never = family == LACE_FAMILY_V4 ? *(const __u32 *)addr == 0
					      : (link_local6(addr) || !(*(const __u64 *)addr | *(const __u64 *)(addr + 8)));
	if (!(pt->flags & PORT_L2_LEARN) || never)
		return drop(DROP_SPOOF);
	return l2_learn(ifindex, pt->net_id, mac, family, addr);
}

/* What l2_flood copies a frame for. Also what l2_arp and l2_nd return
 * (L2_FLOOD_UNKNOWN) for a question from_l2 is to flood: a frame is
 * flooded from one place in the program, which the verifier walks once. */
#define L2_FLOOD_ALL 0      /* a broadcast or multicast: every port */
#define L2_FLOOD_UNKNOWN 1  /* looking for what a learning network does not know: learning ports */
#define L2_FLOOD_ANNOUNCE 2 /* a live migration's announcement: the other nodes only */
#define L2_FLOOD_IT 0x1ace  /* not a tc verdict: from_l2 floods the frame as L2_FLOOD_UNKNOWN */

/* eth_bcast tells whether the frame goes to a broadcast or multicast MAC:
 * a question flooded to find an address goes so (a unicast one, a
 * neighbour's revalidation, was meant for one MAC). */
static __always_inline int eth_bcast(struct __sk_buff *skb)
{
	__u8 d;
	return !bpf_skb_load_bytes(skb, 0, &d, 1) && (d & 1);
}

/* l2_arp answers an ARP request of the port for an address its network
 * holds; on a learning network a broadcast one for an address it does
 * not hold is flooded to its learning ports (whoever holds it answers, and is learned
 * from that answer). Nothing else it sends in ARP goes anywhere: a probe
 * (duplicate detection, from 0.0.0.0) or an announcement of its own
 * address is never answered, and nobody else asks it (every question is
 * answered here or flooded). */
static __noinline int l2_arp(struct __sk_buff *skb, const struct l2_port *pt, const __u8 *smac)
{
	struct arp_msg m;
	if (arp_read(skb, &m))
		return drop(DROP_L2_NOT_FORWARDED);
	if (!mac_eq(m.sha, smac))
		return drop(DROP_L2_SPOOF_MAC);
	/* A gratuitous ARP of an address the network does not know yet is
	 * how a guest announces it: judged before it is refused. */
	__u8 spa[16] = {};
	__builtin_memcpy(spa, m.spa, 4);
	if (*(__u32 *)m.spa != 0 && !src_addr_ok(pt, LACE_FAMILY_V4, spa, smac))
		return l2_bad_source(skb->ingress_ifindex, pt, smac, LACE_FAMILY_V4, spa);
	if (m.oper != ARP_REQUEST || *(__u32 *)m.spa == 0 || eq4(m.spa, m.tpa))
		return drop(DROP_L2_NOT_FORWARDED);
	struct l2_neigh_val *n = neigh_of(pt->net_id, LACE_FAMILY_V4, m.tpa);
	if (!n)
		return (pt->flags & PORT_L2_LEARN) && eth_bcast(skb) ? L2_FLOOD_IT : drop(DROP_L2_UNKNOWN_NEIGH);
	__u8 mac[6];
	__builtin_memcpy(mac, n->mac, 6);
	if (arp_reply(skb, &m, mac))
		return drop(DROP_ADJUST);
	count(FWD_L2_ANSWERED);
	return bpf_redirect(skb->ifindex, 0);
}

/* l2_nd handles the port's neighbour discovery and MLD: a solicitation for
 * an address its network holds is answered (the gateway's with the router
 * flag); on a learning network a plain multicast one (ns_flood_ok) for
 * an address it does not hold is flooded to its learning ports. Duplicate address
 * detection, advertisements, router solicitations and MLD stay on the
 * port; an advertisement (or anything of ND) from an address the network
 * does not know yet is how a guest announces it: judged first. */
static __noinline int l2_nd(struct __sk_buff *skb, const struct l2_port *pt, const __u8 *smac)
{
	__u8 sa[16];
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, saddr), sa, 16))
		return drop(DROP_L2_NOT_FORWARDED);
	if (!link_local6(sa) && (*(__u64 *)sa | *(__u64 *)(sa + 8)) && !src_addr_ok(pt, LACE_FAMILY_V6, sa, smac))
		return l2_bad_source(skb->ingress_ifindex, pt, smac, LACE_FAMILY_V6, sa);
	struct ns_msg m;
	if (ns_read(skb, &m) || ns_is_dad(&m))
		return drop(DROP_L2_NOT_FORWARDED);
	struct l2_neigh_val *n = neigh_of(pt->net_id, LACE_FAMILY_V6, m.target);
	__u8 target[16];
	if (!n && (pt->flags & PORT_L2_LEARN) && eth_bcast(skb) && !link_local6(m.saddr) && ns_flood_ok(skb, ETH_HLEN, smac, target))
		return L2_FLOOD_IT;
	if (!n)
		return drop(DROP_L2_UNKNOWN_NEIGH);
	__u8 mac[6];
	__builtin_memcpy(mac, n->mac, 6);
	__u32 flags = (n->flags & NEIGH_ROUTER) ? NA_ROUTER : 0;
	if (na_reply(skb, &m, mac, flags))
		return drop(DROP_ADJUST);
	count(FWD_L2_ANSWERED);
	return bpf_redirect(skb->ifindex, 0);
}

/* l2_to_node sends a unicast frame to the node where its destination MAC
 * lives: as its IP packet to the network's DT2U SID there (SID_L2_IP),
 * when the frame is IP addressed to that MAC's own address (the receiver
 * rebuilds the frame from the neighbour table). The frame's source was
 * checked by the caller. Not decremented: a switched frame keeps its
 * TTL. */
static __noinline int l2_to_node(struct __sk_buff *skb, __u32 net_id, __u32 from, const __u8 *dmac, const __u8 *node_sid)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return drop(DROP_NOT_IP);
	struct pkt p = {};
	if (parse_ip(skb, eth->h_proto, ETH_HLEN, &p))
		return drop(DROP_L2_NOT_CARRIED);
	struct l2_neigh_val *n = neigh_of(net_id, p.family, p.daddr);
	if (!n || !mac_eq(n->mac, dmac))
		return drop(DROP_L2_NOT_CARRIED);
	/* The sender's egress here (a later fragment by its first's
	 * ports); the receiver's ingress on its node (decap). */
	if (p.frag && l2_pol_say(from) && frag_track(&p, net_id, net_id))
		return drop(DROP_FRAG_NO_FIRST);
	int why = l2_pol(from, POL_OUT, net_id, &p);
	if (why)
		return drop(why);
	__u8 sid[16];
	__builtin_memcpy(sid, node_sid, 16);
	sid[SID_BEHAVIOUR_BYTE] = SID_L2_IP;
	return encap_and_send(skb, &p, sid, 0);
}

/* l2_flood_remote sends the frame whole (next header 143) to the network's
 * DT2M SID of every other node with ports in it: encapsulated once, a copy
 * per node. It returns 0 when the frame itself, left encapsulated, is to
 * be dropped, else the program's verdict (TC_ACT_REDIRECT: it goes to a
 * node whose next hop is being resolved). */
static __noinline int l2_flood_remote(struct __sk_buff *skb, __u32 net_id)
{
	struct l2_net_val *nv = bpf_map_lookup_elem(&lace_l2_nets, &net_id);
	if (!nv || !nv->nremote)
		return 0;
	__u32 n = nv->nremote;
	struct lace_config *cfg = config();
	if (!cfg)
		return drop(DROP_FIB);
	/* A segmentation offload packet cannot be cut once it is inside an
	 * Ethernet frame in IPv6; a broadcast or multicast rarely is one. */
	if (skb->gso_size)
		return drop(DROP_L2_FLOOD_NOT_CARRIED);
	struct ethhdr inner;
	if (bpf_skb_load_bytes(skb, 0, &inner, sizeof(inner)))
		return drop(DROP_ADJUST);
	/* An announcement of a live migration (RARP, ARP) or an ARP request is
	 * no IP, which bpf_skb_adjust_room refuses: room is made in front of
	 * it instead, and it goes by clones only (bpf_redirect_neigh resolves
	 * for IP). */
	int ip = inner.h_proto == bpf_htons(ETH_P_IP) || inner.h_proto == bpf_htons(ETH_P_IPV6);
	/* Padded to Ethernet's shortest frame, zeros, as a wire would: the
	 * receiver's bpf_skb_adjust_room must leave an IPv6 header's worth
	 * behind the outer Ethernet header, which a bare ARP (42 bytes) does
	 * not. */
	if (!ip && skb->len < L2_MIN_FRAME) {
		__u8 zeros[L2_MIN_FRAME - L2_ARP_FRAME] = {};
		__u32 len = skb->len;
		__u32 pad = L2_MIN_FRAME - len;
		if (pad > sizeof(zeros) || bpf_skb_change_tail(skb, L2_MIN_FRAME, 0) || bpf_skb_store_bytes(skb, len, zeros, pad, 0))
			return drop(DROP_ADJUST);
	}
	__u32 frame_len = skb->len;
	if (ip ? bpf_skb_adjust_room(skb, sizeof(struct ipv6hdr) + ETH_HLEN, BPF_ADJ_ROOM_MAC,
				     BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_ENCAP_L2_ETH | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN))
	       : bpf_skb_change_head(skb, sizeof(struct ipv6hdr) + ETH_HLEN, 0))
		return drop(DROP_ADJUST);
	struct ipv6hdr outer = {.version = 6, .nexthdr = IPPROTO_ETHERNET, .hop_limit = 64,
				.payload_len = bpf_htons(frame_len)};
	__builtin_memcpy(&outer.saddr, cfg->underlay_ip6, 16);
	__u16 proto = bpf_htons(ETH_P_IPV6);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &outer, sizeof(outer), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(outer), &inner, sizeof(inner), 0) ||
	    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, 2, 0))
		return drop(DROP_ADJUST);
	skb->mark = LACE_MARK_ENCAP;
	/* A node whose next hop the kernel has not resolved yet cannot take a
	 * clone (bpf_clone_redirect sends as is): the first such one takes
	 * the frame itself, through the kernel's neighbour resolution, as the
	 * program's verdict. */
	__u8 unresolved[16];
	__u32 unresolved_if = 0;
	for (__u32 i = 0; i < L2_FLOOD_MAX; i++) {
		if (i >= n)
			break;
		struct l2_flood_key k = {.net_id = net_id, .idx = L2_FLOOD_MAX + i};
		struct l2_flood_val *v = bpf_map_lookup_elem(&lace_l2_flood, &k);
		if (!v)
			continue;
		struct bpf_fib_lookup fib = {.family = AF_INET6, .ifindex = cfg->underlay_ifindex};
		__builtin_memcpy(fib.ipv6_src, cfg->underlay_ip6, 16);
		__builtin_memcpy(fib.ipv6_dst, v->sid, 16);
		if (bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, daddr), v->sid, 16, 0))
			return drop(DROP_ADJUST);
		long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
		if (rc == BPF_FIB_LKUP_RET_NO_NEIGH && !unresolved_if && ip) {
			__builtin_memcpy(unresolved, v->sid, 16);
			unresolved_if = fib.ifindex;
			continue;
		}
		if (rc != BPF_FIB_LKUP_RET_SUCCESS) {
			drop(DROP_FIB);
			continue;
		}
		if (set_macs(skb, fib.dmac, fib.smac))
			return drop(DROP_ADJUST);
		bpf_clone_redirect(skb, fib.ifindex, 0);
	}
	if (!unresolved_if)
		return 0;
	/* The kernel refuses to resolve for a frame still addressed to a
	 * multicast MAC (the flood's own): the outer MACs are the kernel's
	 * to write. */
	__u8 none[12] = {};
	if (bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, daddr), unresolved, 16, 0) ||
	    bpf_skb_store_bytes(skb, 0, none, sizeof(none), 0))
		return drop(DROP_ADJUST);
	return bpf_redirect_neigh(unresolved_if, 0, 0, 0);
}

/* l2_flood copies a frame (mode L2_FLOOD_*) to the network's other ports
 * on this node and to the other nodes with ports in it; the frame itself
 * is dropped, or sent to a node whose next hop is being resolved
 * (l2_flood_remote). L2_FLOOD_UNKNOWN: the frame looks for an address or
 * MAC its learning network does not know (a silent guest's, as a switch
 * floods what it has not learned): only learning ports take it, and each
 * node receiving it judges it so again (l2_flood_in).
 * L2_FLOOD_ANNOUNCE: an announcement goes to no port: a peer learns
 * nothing from it that its network does not answer; the other nodes move
 * the MAC here (l2_flood_in). */
/* Global, not static: the verifier walks it once with any mode, not once
 * per path that reaches it with another (its two bounded loops are what
 * costs). */
__noinline int l2_flood(struct __sk_buff *skb, __u32 net_id, __u32 from, int mode)
{
	if (mode != L2_FLOOD_ANNOUNCE)
		l2_flood_local(skb, net_id, from, mode == L2_FLOOD_UNKNOWN);
	int rc = l2_flood_remote(skb, net_id);
	if (rc && rc != TC_ACT_REDIRECT)
		return rc;
	if (mode != L2_FLOOD_ANNOUNCE)
		count(mode == L2_FLOOD_UNKNOWN ? FWD_L2_UNKNOWN_FLOODED : FWD_L2_FLOODED);
	return rc ? rc : consumed();
}

/* l2_to_port delivers a frame from port from to a port on this node, as
 * its receiver's policies and the sender's decide (l2_pol), as a Service
 * endpoint's answer when it is one (l2_unnat). */
static __noinline int l2_to_port(struct __sk_buff *skb, __u32 net_id, __u32 from, __u32 ifindex)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return drop(DROP_NOT_IP);
	struct pkt p = {};
	if (parse_ip(skb, eth->h_proto, ETH_HLEN, &p))
		return drop(DROP_NOT_IP);
	int say_in = l2_pol_say(ifindex);
	if (say_in || l2_pol_say(from)) {
		/* Where a policy decides: a later fragment by its first's
		 * ports, and a frame only to the MAC of its destination
		 * address (the receiver's flow is keyed by that address: a pod
		 * may not record a flow in another's name). */
		if (p.frag && frag_track(&p, net_id, net_id))
			return drop(DROP_FRAG_NO_FIRST);
		struct l2_neigh_val *n = say_in ? neigh_of(net_id, p.family, p.daddr) : NULL;
		if (say_in && (!n || !mac_eq(n->mac, eth->h_dest)))
			return drop(DROP_L2_NOT_CARRIED);
	}
	int why = l2_pol(from, POL_OUT, net_id, &p);
	/* Decided before a Service endpoint's answer takes its VIP: the
	 * client's flow is keyed by the endpoint. */
	if (!why)
		why = l2_pol(ifindex, POL_IN, net_id, &p);
	if (why)
		return drop(why);
	if (l2_unnat(skb, &p, net_id))
		return drop(DROP_ADJUST);
	count(FWD_L2_SWITCHED);
	return bpf_redirect_peer(ifindex, 0);
}

/* is_nd tells whether an IPv6 packet is neighbour discovery or MLD,
 * which never leave the port. */
static __always_inline int is_nd(struct ipv6hdr *ip6, void *end)
{
	__u8 *icmp = (void *)(ip6 + 1);
	if (ip6->nexthdr != IPPROTO_ICMPV6 || (void *)(icmp + 1) > end)
		return 0;
	return (icmp[0] >= 130 && icmp[0] <= 137) || icmp[0] == 143;
}

/* l2_unknown_mac drops a frame whose source MAC is not the port's. On a
 * learning port a unicast MAC its network does not place, or places on
 * another node or port (a move), is reported with the frame's source
 * address; never the gateway's, a multicast one or one of no address. */
static __noinline int l2_unknown_mac(struct __sk_buff *skb, const struct l2_port *pt, const __u8 *mac, __u32 fdb_flags)
{
	if (!(pt->flags & PORT_L2_LEARN) || (fdb_flags & FDB_GATEWAY) || (mac[0] & 1) ||
	    (*(const __u32 *)mac == 0 && *(const __u16 *)(mac + 4) == 0))
		return drop(DROP_L2_SPOOF_MAC);
	__u16 proto;
	__u8 addr[16] = {};
	__u8 family = 0;
	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, 2))
		return drop(DROP_NOT_IP);
	if (proto == bpf_htons(ETH_P_ARP_)) {
		/* Ethernet/IPv4 ARP: the sender's address after its MAC. */
		if (!bpf_skb_load_bytes(skb, ETH_HLEN + 14, addr, 4) && *(__u32 *)addr)
			family = LACE_FAMILY_V4;
	} else if (proto == bpf_htons(ETH_P_IP)) {
		if (!bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, saddr), addr, 4) && *(__u32 *)addr)
			family = LACE_FAMILY_V4;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		if (!bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, saddr), addr, 16) && !link_local6(addr) &&
		    (*(__u64 *)addr | *(__u64 *)(addr + 8)))
			family = LACE_FAMILY_V6;
	}
	if (!family)
		__builtin_memset(addr, 0, sizeof(addr));
	return l2_learn(skb->ingress_ifindex, pt->net_id, mac, family, addr);
}

/* What the first frame at a standby port is (l2_activate). */
#define L2_STANDBY_DATA 0     /* the VM's data: it runs here now */
#define L2_STANDBY_ANNOUNCE 1 /* the VM's announcement: carried to the other nodes */
#define L2_STANDBY_NOT_YET 2  /* not the VM: dropped, nothing moves */

/* l2_standby_frame says what the frame at standby port pt is. Only the VM
 * moves the MAC: QEMU's RARP, a gratuitous ARP or an unsolicited
 * neighbour advertisement of the port's own address, or IP (an ARP
 * request, a neighbour solicitation) from that address. What the target pod's own kernel sends with the MAC before the
 * VM is there (duplicate address detection, router solicitations, MLD:
 * from no address or a link-local one) is not it: the port carries
 * nothing until then (OVN's activation-strategy=rarp). */
static __always_inline int l2_standby_frame(struct __sk_buff *skb, const struct l2_port *pt, const struct ethhdr *eth)
{
	__u8 a[16];
	if (eth->h_proto == bpf_htons(ETH_P_RARP_))
		return L2_STANDBY_ANNOUNCE;
	if (eth->h_proto == bpf_htons(ETH_P_ARP_)) {
		/* From its own address: a gratuitous ARP (sender and target
		 * alike) announces, a request is the VM resolving a peer (its
		 * link came up anew and its cache is empty). */
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 14, a, 4) || bpf_skb_load_bytes(skb, ETH_HLEN + 24, a + 4, 4) ||
		    !(pt->flags & PORT_HAS_V4) || !eq4(a, pt->ip4))
			return L2_STANDBY_NOT_YET;
		return eq4(a + 4, pt->ip4) ? L2_STANDBY_ANNOUNCE : L2_STANDBY_DATA;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, saddr), a, 4))
			return L2_STANDBY_NOT_YET;
		return (pt->flags & PORT_HAS_V4) && eq4(a, pt->ip4) ? L2_STANDBY_DATA : L2_STANDBY_NOT_YET;
	}
	if (eth->h_proto != bpf_htons(ETH_P_IPV6) || !(pt->flags & PORT_HAS_V6) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, saddr), a, 16) || !eq16(a, pt->ip6))
		return L2_STANDBY_NOT_YET;
	__u8 nh, type;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, nexthdr), &nh, 1) || nh != IPPROTO_ICMPV6)
		return L2_STANDBY_DATA;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(struct ipv6hdr), &type, 1))
		return L2_STANDBY_NOT_YET;
	/* From its own address: an advertisement announces, a solicitation is
	 * the VM resolving a peer; the rest of ND and MLD is any kernel's. */
	if (type == 136)
		return L2_STANDBY_ANNOUNCE;
	if (type == 135)
		return L2_STANDBY_DATA;
	return (type >= 130 && type <= 137) || type == 143 ? L2_STANDBY_NOT_YET : L2_STANDBY_DATA;
}

/* l2_activate moves the MAC of entry f (key k) to its standby port pt, the
 * port this frame came from, when the frame is the VM's (l2_standby_frame):
 * the live migration's VM runs here now. The agent hears of it
 * (lace-controller publishes the move, sequence + 1); the other nodes
 * follow the announcement (L2_FLOOD_ANNOUNCE), or the VM's first frame to them
 * (fdb_from_node). It returns what the frame is. */
static __noinline int l2_activate(struct __sk_buff *skb, const struct l2_port *pt, const struct fdb_key *k, const struct fdb_val *f)
{
	struct ethhdr eth;
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)))
		return L2_STANDBY_NOT_YET;
	int what = l2_standby_frame(skb, pt, &eth);
	if (what == L2_STANDBY_NOT_YET)
		return what;
	__u32 seq = f->seq;
	l2_move(k, f);
	count(FWD_L2_ACTIVATED);
	struct l2_learn_event *e = bpf_ringbuf_reserve(&lace_l2_learn, sizeof(*e), 0);
	if (e) {
		__builtin_memset(e, 0, sizeof(*e));
		e->ifindex = skb->ingress_ifindex;
		e->net_id = k->net_id;
		__builtin_memcpy(e->mac, k->mac, 6);
		e->kind = L2_EVENT_ACTIVATED;
		e->seq = seq;
		bpf_ringbuf_submit(e, 0);
	}
	return what;
}

static __always_inline int from_l2_run(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ingress_ifindex;
	struct port_val *port = bpf_map_lookup_elem(&lace_ports, &ifindex);
	if (!port || !(port->flags & PORT_L2))
		return drop(DROP_UNKNOWN_PORT);
	/* An 802.1Q tag the kernel took out of the frame stays with it
	 * through a redirect: to a peer, to the underlay (from_pod). An l2
	 * network is one untagged segment. */
	if (skb->vlan_present)
		return drop(DROP_NOT_IP);
	struct l2_port pt = {.net_id = port->net_id, .flags = port->flags};
	int mode = L2_FLOOD_ALL; /* when flooded */
	__builtin_memcpy(pt.ip4, port->ip4, 4);
	__builtin_memcpy(pt.ip6, port->ip6, 16);

	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return drop(DROP_NOT_IP);
	__u16 proto = eth->h_proto;

	/* The source MAC is the port's: lace_fdb holds it for this port. */
	struct fdb_key k = {.net_id = pt.net_id};
	__builtin_memcpy(k.mac, eth->h_source, 6);
	struct fdb_val *src = bpf_map_lookup_elem(&lace_fdb, &k);
	if (!src)
		return l2_unknown_mac(skb, &pt, k.mac, 0);
	if (fdb_port(&k, src) != ifindex) {
		/* At its standby port: a live migration's VM, here now. */
		if (!(src->flags & FDB_ALT) || src->alt_ifindex != ifindex || fdb_moved(&k, src))
			return l2_unknown_mac(skb, &pt, k.mac, src->flags);
		int what = l2_activate(skb, &pt, &k, src);
		if (what == L2_STANDBY_NOT_YET)
			return drop(DROP_L2_STANDBY);
		if (what == L2_STANDBY_ANNOUNCE) {
			mode = L2_FLOOD_ANNOUNCE;
			goto flood;
		}
	}

	int icmp = 0; /* an ICMP or ICMPv6 header right after the IP header */
	if (proto == bpf_htons(ETH_P_ARP_)) {
		int rc = l2_arp(skb, &pt, k.mac);
		if (rc != L2_FLOOD_IT)
			return rc;
		mode = L2_FLOOD_UNKNOWN;
		goto flood;
	}
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end)
			return drop(DROP_NOT_IP);
		__u8 sa[16] = {};
		__builtin_memcpy(sa, &ip->saddr, 4);
		if (!src_addr_ok(&pt, LACE_FAMILY_V4, sa, k.mac))
			return l2_bad_source(ifindex, &pt, k.mac, LACE_FAMILY_V4, sa);
		icmp = ip->protocol == IPPROTO_ICMP;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end)
			return drop(DROP_NOT_IP);
		if (is_nd(ip6, end)) {
			int rc = l2_nd(skb, &pt, k.mac);
			if (rc != L2_FLOOD_IT)
				return rc;
			mode = L2_FLOOD_UNKNOWN;
			goto flood;
		}
		__u8 sa[16];
		__builtin_memcpy(sa, &ip6->saddr, 16);
		if (!src_addr_ok(&pt, LACE_FAMILY_V6, sa, k.mac))
			return l2_bad_source(ifindex, &pt, k.mac, LACE_FAMILY_V6, sa);
		__u8 nh = ip6->nexthdr;
		icmp = nh == IPPROTO_ICMPV6;
		/* ND behind an extension header: a poisoned peer. */
		if ((nh == 0 || nh == 43 || nh == IPV6_FRAGMENT || nh == 60) && l2_carries_nd(skb, ETH_HLEN))
			return drop(DROP_L2_NOT_FORWARDED);
	} else {
		return drop(DROP_NOT_IP);
	}
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	eth = data;
	if ((void *)(eth + 1) > end)
		return drop(DROP_NOT_IP);

	if (eth->h_dest[0] & 1)
		goto flood;
	__builtin_memcpy(k.mac, eth->h_dest, 6);
	struct fdb_val *dst = bpf_map_lookup_elem(&lace_fdb, &k);
	if (dst && (dst->flags & FDB_GATEWAY)) {
		bpf_tail_call(skb, &lace_l2_jump, L2_JUMP_ROUTE);
		return drop(DROP_L2_NO_ROUTER);
	}
	/* Switched: an ICMP error only about what its receiver sent here. */
	if (icmp && l2_foreign_error(skb, ETH_HLEN, proto == bpf_htons(ETH_P_IP) ? LACE_FAMILY_V4 : LACE_FAMILY_V6))
		return drop(DROP_ICMP_NOT_OURS);
	/* A MAC the network does not place: a learning network looks for it
	 * (a silent guest's, or one whose entry aged out of a peer's cache). */
	if (!dst) {
		int v4 = proto == bpf_htons(ETH_P_IP);
		struct l2_neigh_key nk = {.net_id = pt.net_id, .family = v4 ? LACE_FAMILY_V4 : LACE_FAMILY_V6};
		if (!(pt.flags & PORT_L2_LEARN) || !l2_unknown_ip_ok(skb, ETH_HLEN, &nk, v4))
			return drop(DROP_L2_UNKNOWN_DST);
		mode = L2_FLOOD_UNKNOWN;
		goto flood;
	}
	__u32 difindex = fdb_port(&k, dst);
	const __u8 *node = fdb_node(&k, dst);
	__u8 dsid[16];
	if (node)
		__builtin_memcpy(dsid, node, 16);
	if (node)
		return l2_to_node(skb, pt.net_id, ifindex, k.mac, dsid);
	/* A frame back to its own port is no switching. */
	if (!difindex || difindex == ifindex)
		return drop(DROP_L2_UNKNOWN_DST);
	return l2_to_port(skb, pt.net_id, ifindex, difindex);
flood:
	/* A flooded IP frame is no flow a rule can admit: a port a policy
	 * isolates for egress sends none (its receivers' ingress: l2_flood_local). */
	if ((proto == bpf_htons(ETH_P_IP) || proto == bpf_htons(ETH_P_IPV6)) && l2_flood_refused(ifindex))
		return drop(DROP_POLICY);
	return l2_flood(skb, pt.net_id, ifindex, mode);
}

/* The drop it noted told as it ends (flows.h). */
SEC("tc")
int from_l2(struct __sk_buff *skb)
{
	return flow_drop_tell(skb, from_l2_run(skb), FLOW_AT_POD_OUT);
}

char __license[] SEC("license") = "GPL";
