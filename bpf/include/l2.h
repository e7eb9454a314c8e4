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

/* mac_eq compares two MACs byte by byte: one may sit anywhere in a
 * header copied to the stack, where the verifier refuses a misaligned
 * wider load. */
static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return !((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) | (a[4] ^ b[4]) | (a[5] ^ b[5]));
}

struct fdb_key {
	__u32 net_id;
	__u8 mac[6];
	__u16 pad;
};

struct fdb_val {
	__u32 ifindex;     /* FDB_LOCAL: the port's host side */
	__u32 flags;
	__u32 seq;         /* the MAC's move sequence (RFC 7432 section 15), low 32 bits */
	__u32 alt_ifindex; /* FDB_ALT: the standby port on this node, or 0 */
	__u8 sid[16];      /* FDB_REMOTE: the node's SID for the network's frames */
	__u8 alt_sid[16];  /* FDB_ALT, alt_ifindex 0: the standby node's SID */
};
#define FDB_LOCAL 1
/* The anycast gateway's MAC, the same on every node: what is sent to it
 * is routed (from_pod). */
#define FDB_GATEWAY 2
#define FDB_REMOTE 4
/* The MAC has a standby location (a live migration's target: a second pod
 * of its IPAMClaim, which lace-controller published in its FDBEntry): it
 * moves there, on this node's own authority, the moment it shows up there
 * (lace_l2_moves). */
#define FDB_ALT 8

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

/* The MACs that moved to their standby location (FDB_ALT), written by the
 * data plane when the MAC appeared there: at the standby port itself
 * (from_l2, the migrated VM's first frame or announcement) or in a frame
 * from the standby node (decap: RFC 8986's End.DT2U learns the source).
 * A move holds for the entry's sequence only: lace-controller publishing
 * the move (sequence + 1) makes the entry say it itself. The agent deletes
 * a move when the entry loses its standby. */
struct l2_move_val {
	__u32 seq;
	__u32 pad;
	__u64 at; /* ktime of the move */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct fdb_key);
	__type(value, struct l2_move_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_l2_moves SEC(".maps");

/* fdb_moved tells whether the MAC of entry f (key k) lives at its standby
 * location now. */
static __always_inline int fdb_moved(const struct fdb_key *k, const struct fdb_val *f)
{
	if (!(f->flags & FDB_ALT))
		return 0;
	struct l2_move_val *m = bpf_map_lookup_elem(&lace_l2_moves, k);
	return m && m->seq == f->seq;
}

/* fdb_port is the port on this node the MAC of f lives at now (0: none). */
static __always_inline __u32 fdb_port(const struct fdb_key *k, const struct fdb_val *f)
{
	if (fdb_moved(k, f))
		return f->alt_ifindex;
	return (f->flags & (FDB_LOCAL | FDB_GATEWAY)) == FDB_LOCAL ? f->ifindex : 0;
}

/* fdb_node is the SID of the node the MAC of f lives on now (NULL: this
 * one, or the gateway). */
static __always_inline const __u8 *fdb_node(const struct fdb_key *k, const struct fdb_val *f)
{
	if (fdb_moved(k, f))
		return f->alt_ifindex ? 0 : f->alt_sid;
	return (f->flags & FDB_REMOTE) ? f->sid : 0;
}

/* l2_move records that the MAC of f (key k) lives at its standby location
 * from now on (for f's sequence). */
static __always_inline void l2_move(const struct fdb_key *k, const struct fdb_val *f)
{
	struct l2_move_val m = {.seq = f->seq, .at = bpf_ktime_get_ns()};
	bpf_map_update_elem(&lace_l2_moves, k, &m, BPF_ANY);
}

/* fdb_from_node tells whether the MAC of f (key k) lives on the node of
 * locator loc: a frame from it there is the MAC's own. A MAC whose standby
 * is that node moves there (the migrated VM's frame, or its node's
 * announcement, came first). */
static __always_inline int fdb_from_node(const struct fdb_key *k, const struct fdb_val *f, const void *loc)
{
	const __u8 *sid = fdb_node(k, f);
	if (sid && eq8(sid, loc))
		return 1;
	if ((f->flags & FDB_ALT) && !f->alt_ifindex && eq8(f->alt_sid, loc) && !fdb_moved(k, f)) {
		l2_move(k, f);
		count(FWD_L2_MOVED);
		return 1;
	}
	return 0;
}

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

/* l2_carries_nd tells whether the IPv6 packet at l3_off is neighbour
 * discovery, MLD or a router message (ICMPv6 130-137, 143), also behind
 * extension headers (hop-by-hop, routing, destination options, a first or
 * atomic fragment): a stack processes such a message after its extension
 * headers, so an advertisement hidden behind one would reach a peer and
 * move one of its neighbour entries (the gateway's) to the sender's MAC.
 * Nothing of ND is switched or carried: it is answered on each node. A
 * chain too long or cut short counts as ND. A later fragment carries no
 * header: its first fragment is judged. */
static __noinline __attribute__((unused)) int l2_carries_nd(struct __sk_buff *skb, __u32 l3_off)
{
	__u8 next;
	if (bpf_skb_load_bytes(skb, l3_off + offsetof(struct ipv6hdr, nexthdr), &next, 1))
		return 1;
	__u32 off = l3_off + sizeof(struct ipv6hdr);
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u8 h[4];
		if (next == 0 || next == 43 || next == 60) {
			if (bpf_skb_load_bytes(skb, off, h, 2))
				return 1;
			next = h[0];
			off += ((__u32)h[1] + 1) * 8;
		} else if (next == 44) {
			if (bpf_skb_load_bytes(skb, off, h, 4))
				return 1;
			if (((((__u16)h[2]) << 8) | h[3]) & 0xfff8)
				return 0;
			next = h[0];
			off += 8;
		}
	}
	if (next == 0 || next == 43 || next == 44 || next == 60)
		return 1;
	if (next != IPPROTO_ICMPV6)
		return 0;
	__u8 type;
	if (bpf_skb_load_bytes(skb, off, &type, 1))
		return 1;
	return (type >= 130 && type <= 137) || type == 143;
}

/* l2_foreign_error tells whether the IP packet at l3_off (family: the
 * packet's) is an ICMP error about something else than a packet its
 * receiver sent to its sender: the quoted packet must go from the
 * receiver (the error's destination) to the sender (its source, the
 * port's own address). A switched error is otherwise unchecked (no flow is
 * tracked), and a peer of the segment could tell another pod's flows to
 * any host that the path is too small (a 552-byte or 1280-byte path MTU)
 * or that the far end refused them; a routed one is judged by conntrack
 * in from_pod. No port of an l2 network forwards others' packets (its
 * source is its own), so no legitimate error quotes anything else. An
 * error too short for its quote is foreign. */
static __noinline __attribute__((unused)) int l2_foreign_error(struct __sk_buff *skb, __u32 l3_off, __u8 family)
{
	__u8 s[16], d[16], qs[16], qd[16], type;
	__u32 l4_off, q_off;
	if (family == LACE_FAMILY_V4) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, l3_off, &ip, sizeof(ip)))
			return 0;
		if (ip.protocol != IPPROTO_ICMP || (ip.frag_off & bpf_htons(0x1fff)))
			return 0;
		l4_off = l3_off + ip.ihl * 4;
		if (bpf_skb_load_bytes(skb, l4_off, &type, 1))
			return 1;
		if (type != 3 && type != 11 && type != 12)
			return 0;
		q_off = l4_off + 8 + offsetof(struct iphdr, saddr);
		if (bpf_skb_load_bytes(skb, q_off, qs, 4) || bpf_skb_load_bytes(skb, q_off + 4, qd, 4))
			return 1;
		return *(__u32 *)qs != ip.daddr || *(__u32 *)qd != ip.saddr;
	}
	struct ipv6hdr ip6;
	if (bpf_skb_load_bytes(skb, l3_off, &ip6, sizeof(ip6)))
		return 0;
	if (ip6.nexthdr != IPPROTO_ICMPV6)
		return 0;
	l4_off = l3_off + sizeof(ip6);
	if (bpf_skb_load_bytes(skb, l4_off, &type, 1))
		return 1;
	if (type >= 128)
		return 0;
	q_off = l4_off + 8 + offsetof(struct ipv6hdr, saddr);
	if (bpf_skb_load_bytes(skb, q_off, qs, 16) || bpf_skb_load_bytes(skb, q_off + 16, qd, 16))
		return 1;
	__builtin_memcpy(s, &ip6.saddr, 16);
	__builtin_memcpy(d, &ip6.daddr, 16);
	return !eq16(qs, d) || !eq16(qd, s);
}

/* Flooding: per network, the ports on this node (lace_l2_flood entries
 * 0..nlocal-1: host-side ifindexes) and the other nodes with ports in it
 * (entries L2_FLOOD_MAX..L2_FLOOD_MAX+nremote-1: their DT2M SIDs), counted
 * in lace_l2_nets. */
#define L2_FLOOD_MAX 128

/* Ethernet's shortest frame (without its checksum), and an IPv4 ARP
 * message's frame, which a stack sends unpadded on a veth. */
#define L2_MIN_FRAME 60
#define L2_ARP_FRAME 42

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

/* l2_isolated tells whether a policy isolates port ifindex in direction
 * dir: a flooded IP frame (broadcast, multicast, unknown unicast), which
 * no rule can be matched to as a flow, never reaches or leaves such a
 * port. */
static __always_inline int l2_isolated(__u32 ifindex, __u32 dir)
{
	struct pol_ep_val *ep = bpf_map_lookup_elem(&lace_pol_eps, &ifindex);
	return ep && (ep->flags & POL_ISOLATED(dir));
}

/* l2_flood_refused tells whether a policy isolates port ifindex for
 * egress (it floods no IP frame), and counts the refusal on that policy
 * as pol_denied counts its own: the policies' drops add up to those
 * counted as policy (lace_policy_drops_total, lace_drops). */
static __always_inline int l2_flood_refused(__u32 ifindex)
{
	struct pol_ep_val *ep = bpf_map_lookup_elem(&lace_pol_eps, &ifindex);
	if (!ep || !(ep->flags & POL_ISOLATED(POL_OUT)))
		return 0;
	__u32 deny = ep->deny_out;
	__u64 *n = bpf_map_lookup_elem(&lace_pol_drops, &deny);
	if (n) {
		*n += 1; /* per CPU */
	} else {
		__u64 one = 1;
		bpf_map_update_elem(&lace_pol_drops, &deny, &one, BPF_NOEXIST);
	}
	return 1;
}

/* l2_pol_say tells whether a policy has a say on port ifindex. */
static __always_inline int l2_pol_say(__u32 ifindex)
{
	return bpf_map_lookup_elem(&lace_pol_eps, &ifindex) != NULL;
}

/* l2_flood_local copies the frame to the network's ports on this node but
 * skip (the port it came from); learning: only to ports that learn (what
 * is flooded to find an address or MAC its network does not know, which
 * only a learning network may hold). Bounded: the verifier walks it once
 * per iteration, L2_FLOOD_MAX at most. */
static __always_inline void l2_flood_local(struct __sk_buff *skb, __u32 net_id, __u32 skip, int learning)
{
	struct l2_net_val *nv = bpf_map_lookup_elem(&lace_l2_nets, &net_id);
	if (!nv)
		return;
	/* An IP frame skips the ports a policy isolates for ingress. */
	__u16 proto = 0;
	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, 2))
		return;
	int ip = proto == bpf_htons(ETH_P_IP) || proto == bpf_htons(ETH_P_IPV6);
	__u32 n = nv->nlocal;
	for (__u32 i = 0; i < L2_FLOOD_MAX; i++) {
		if (i >= n)
			break;
		struct l2_flood_key k = {.net_id = net_id, .idx = i};
		struct l2_flood_val *v = bpf_map_lookup_elem(&lace_l2_flood, &k);
		if (!v || v->ifindex == skip)
			continue;
		__u32 ifi = v->ifindex;
		if (learning) {
			struct port_val *pv = bpf_map_lookup_elem(&lace_ports, &ifi);
			if (!pv || !(pv->flags & PORT_L2_LEARN) || pv->net_id != net_id)
				continue;
		}
		if (ip && l2_isolated(ifi, POL_IN))
			continue;
		bpf_clone_redirect(skb, ifi, 0);
	}
}

/* l2_unknown_ip_ok tells whether the IP packet at l3_off (v4 or IPv6), in
 * a unicast frame to a MAC its learning network does not place, may be
 * flooded to find that MAC: not when its destination is an address the
 * network holds (its frame belongs to that address's MAC: a stale cache,
 * or a tenant spraying another's traffic to every learning port), nor an
 * ICMP error (about a flow its unknown receiver cannot have had). */
static __always_inline __attribute__((unused)) int l2_unknown_ip_ok(struct __sk_buff *skb, __u32 l3_off, struct l2_neigh_key *nk, int v4)
{
	/* nk is the caller's (its net_id and family set), its address the
	 * only buffer: stack is scarce where this runs, deep in
	 * from_underlay's calls. */
	if (bpf_skb_load_bytes(skb, l3_off + (v4 ? offsetof(struct iphdr, daddr) : offsetof(struct ipv6hdr, daddr)), nk->addr, v4 ? 4 : 16) ||
	    bpf_map_lookup_elem(&lace_l2_neigh, nk))
		return 0;
	__u8 *h = nk->addr;
	if (bpf_skb_load_bytes(skb, l3_off + (v4 ? offsetof(struct iphdr, protocol) : offsetof(struct ipv6hdr, nexthdr)), h, 1))
		return 0;
	/* The first header after a bare IP header: an options-laden one is
	 * judged as a non-error (its sender's node ran l2_foreign_error). */
	if (h[0] != (v4 ? IPPROTO_ICMP : IPPROTO_ICMPV6))
		return 1;
	if (bpf_skb_load_bytes(skb, l3_off + (v4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr)), h + 1, 1))
		return 0;
	return v4 ? h[1] != 3 && h[1] != 11 && h[1] != 12 : h[1] >= 128;
}

/* ns_flood_ok tells whether the IPv6 packet at l3_off is a plain neighbour
 * solicitation (no extension header, hop limit 255) whose only option, if
 * it has one, is its source link-layer address smac, and gives its
 * target: the one piece of ND a learning network floods (to find an
 * address it does not hold), on both ends of the fabric. Its receivers
 * bind the solicitation's source to that option: nothing else may ride
 * along. */
static __always_inline __attribute__((unused)) int ns_flood_ok(struct __sk_buff *skb, __u32 l3_off, const __u8 *smac, __u8 *target)
{
	/* Loaded piecemeal: this runs deep in from_underlay's calls, where
	 * the stack is counted. h: payload length, next header, hop limit. */
	__u8 h[8];
	if (bpf_skb_load_bytes(skb, l3_off + offsetof(struct ipv6hdr, payload_len), h, 4) || h[2] != IPPROTO_ICMPV6 ||
	    h[3] != 255)
		return 0;
	__u16 len = ((__u16)h[0] << 8) | h[1];
	__u32 icmp = l3_off + sizeof(struct ipv6hdr);
	if ((len != 24 && len != 32) || bpf_skb_load_bytes(skb, icmp, h, 2) || h[0] != 135 || h[1] != 0)
		return 0;
	if (len == 32 && (bpf_skb_load_bytes(skb, icmp + 24, h, 8) || h[0] != 1 || h[1] != 1 || !mac_eq(h + 2, smac)))
		return 0;
	return !bpf_skb_load_bytes(skb, icmp + 8, target, 16);
}

/* l2_unnat: a switched frame may be a Service endpoint's answer to a
 * client of its segment whose flow was translated (the client sent to the
 * VIP through the gateway, where from_pod translated it; the endpoint
 * answers the client directly, on-link). It must leave from the VIP, and
 * the client's flow must see the answer (its handshake settles), as on
 * the routed path. p is the frame's IP packet after the Ethernet header.
 * Only looked up: switched flows are tracked only where a policy has a
 * say (l2_pol). -1: the rewrite failed. */
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

/* The key l2_pol builds: a map value, not its frame, which sits at the end
 * of from_underlay's call chain to l2_decap. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ct_key);
} lace_l2_pol_key SEC(".maps");

/* l2_pol decides a switched packet p of l2 network net_id at the l2 port
 * ifindex, in direction dir (POL_OUT: the port's pod sent it; POL_IN: it
 * goes to that pod), as the routed path decides at from_pod and at
 * delivery. A port no policy has a say on passes, no flow tracked: an
 * unpoliced network's switching costs one lookup. Otherwise a packet of a
 * flow the other side opened is a reply and passes (the pod's own reset
 * is final, as from_pod makes it); one in a flow's opening direction is
 * decided (every packet, so a narrowed policy stops an open flow too),
 * and the flow is recorded from the port's side, so that its replies pass
 * both ways. A later fragment comes with its first's ports (the caller's
 * frag_track). Returns 0, or the drop reason (pol_denied counted a
 * policy's refusal on the policy). A global function: verified once, and
 * its frame stays off the flood chains. */
__noinline int l2_pol(__u32 ifindex, __u32 dir, __u32 net_id, struct pkt *p)
{
	/* An ICMP error belongs to the flow it quotes, which its receiver
	 * sent (l2_foreign_error judges that): never a flow of its own. */
	if (!p || is_icmp_error(p) || !bpf_map_lookup_elem(&lace_pol_eps, &ifindex))
		return 0;
	struct ct_key *k = bpf_map_lookup_elem(&lace_l2_pol_key, &lace_zero_key);
	if (!k)
		return 0;
	int out = dir == POL_OUT;
	__u16 opener = out ? CT_ORIGIN_LOCAL : 0;
	ct_key_of(k, net_id, p, out);
	struct ct_val *ct = ct_lookup(k);
	int fresh = ct && !(is_tcp_syn(p) && ct_closing(ct));
	/* A flow the pod routed to another network that holds the same
	 * address is no switched flow's. */
	if (fresh && ct->peer_net != net_id)
		return DROP_CT_OTHER_NET;
	if (fresh && (ct->flags & CT_ORIGIN_LOCAL) != opener) {
		ct_refresh(ct, p, 0);
		if (out && p->proto == IPPROTO_TCP && (p->tcp_flags & TCP_RST))
			ct->flags |= CT_RST_LOCAL;
		return 0;
	}
	if (pol_denied(ifindex, dir, net_id, p))
		return DROP_POLICY;
	if (fresh)
		ct_refresh(ct, p, 1);
	else
		ct_create(k, net_id, opener, 0, p, 1);
	return 0;
}

/* Learning (PORT_L2_LEARN): a source its network does not know, reported
 * to the agent through lace_l2_learn, at most one report per port every
 * L2_LEARN_GAP_NS (lace_l2_learn_gap: a guest cannot fill the ring, nor the
 * agent's work, faster than that). family 0: the MAC alone. */
struct l2_learn_event {
	__u32 ifindex;
	__u32 net_id;
	__u8 mac[6];
	__u8 family;
	__u8 kind; /* L2_EVENT_* */
	__u8 addr[16];
	__u32 seq; /* L2_EVENT_ACTIVATED: the FDB entry's sequence */
};
/* A source to learn; a MAC that showed up at its standby port here (a live
 * migration's target: lace-controller publishes the move). */
#define L2_EVENT_LEARN 0
#define L2_EVENT_ACTIVATED 1

#define L2_LEARN_GAP_NS (50 * 1000 * 1000ULL)

/* Names the record's type in BTF for bpf2go (a ring has no value type). */
const struct l2_learn_event *l2_learn_event_unused __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_l2_learn SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_l2_learn_gap SEC(".maps");

/* l2_learned_port finds the port on this node holding a learned address
 * of network net_id: its neighbour entry's MAC, living at a learning port
 * here (an assigned address has its endpoint entry, local_pod's). macs
 * as local_pod's: the MAC first. */
static __always_inline __attribute__((unused)) int l2_learned_port(__u32 net_id, __u8 family, const __u8 *addr, __u32 *ifindex, __u8 *macs)
{
	struct l2_neigh_key nk = {.net_id = net_id, .family = family};
	__builtin_memcpy(nk.addr, addr, 16);
	struct l2_neigh_val *n = bpf_map_lookup_elem(&lace_l2_neigh, &nk);
	if (!n)
		return -1;
	struct fdb_key fk = {.net_id = net_id};
	__builtin_memcpy(fk.mac, n->mac, 6);
	struct fdb_val *f = bpf_map_lookup_elem(&lace_fdb, &fk);
	if (!f)
		return -1;
	__u32 ifi = fdb_port(&fk, f);
	if (!ifi)
		return -1;
	struct port_val *pv = bpf_map_lookup_elem(&lace_ports, &ifi);
	if (!pv || !(pv->flags & PORT_L2_LEARN) || pv->net_id != net_id)
		return -1;
	*ifindex = ifi;
	__builtin_memcpy(macs, n->mac, 6);
	return 0;
}

#endif
