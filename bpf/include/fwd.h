/* Forwarding shared by the pod and underlay programs: the view lookup,
 * delivery to a local pod, SRv6 encapsulation, sending plain IP out of the
 * underlay, and SNAT toward external networks. */
#ifndef LACE_FWD_H
#define LACE_FWD_H

#include "lace.h"
#include "ct.h"
#include "frag.h"

/* view_lookup resolves p's destination in the view of network view_net. */
static __always_inline struct route_val *view_lookup(__u32 view_net, struct pkt *p)
{
	struct route_key rk = {.prefixlen = 64 + 128, .net_id = view_net, .family = p->family};
	__builtin_memcpy(rk.addr, p->daddr, 16);
	return bpf_map_lookup_elem(&lace_routes, &rk);
}

/* view_lookup_src resolves p's source in the view of network view_net. */
static __always_inline struct route_val *view_lookup_src(__u32 view_net, struct pkt *p)
{
	struct route_key rk = {.prefixlen = 64 + 128, .net_id = view_net, .family = p->family};
	__builtin_memcpy(rk.addr, p->saddr, 16);
	return bpf_map_lookup_elem(&lace_routes, &rk);
}

/* classify returns the external network a plain-IP source belongs to (the
 * longest external prefix covering it), or 0. */
static __always_inline __u32 classify(struct pkt *p)
{
	struct class_key ck = {.prefixlen = 32 + 128, .family = p->family};
	__builtin_memcpy(ck.addr, p->saddr, 16);
	__u32 *net = bpf_map_lookup_elem(&lace_classify, &ck);
	return net ? *net : 0;
}

/* l4_header_len is the length of a TCP or UDP header at p->l4_off, or 0. */
static __always_inline __u32 l4_header_len(struct __sk_buff *skb, struct pkt *p)
{
	if (p->proto == IPPROTO_UDP)
		return sizeof(struct udphdr);
	if (p->proto != IPPROTO_TCP)
		return 0;
	/* Loaded, not read in place: l4_off passed through frag_track's
	 * frame, and the verifier no longer bounds it for packet access. */
	__u8 doff;
	if (bpf_skb_load_bytes(skb, p->l4_off + 12, &doff, 1))
		return sizeof(struct tcphdr);
	return (doff >> 4) * 4;
}

/* too_big tells whether the packet, encapsulated, would not fit the
 * underlay's current MTU (read from the device, so a fabric whose MTU
 * drops is noticed at the next packet), and sets *mtu to what the pod may
 * send. A GSO packet is judged by the segments it will be cut into. */
static __always_inline int too_big(struct __sk_buff *skb, struct pkt *p, __u32 ifindex, __u32 *mtu)
{
	__u32 dev_mtu = 0;
	long rc = bpf_check_mtu(skb, ifindex, &dev_mtu, sizeof(struct ipv6hdr), 0);
	if (rc < 0 || dev_mtu <= sizeof(struct ipv6hdr) + 68)
		return 0; /* no such device: the FIB lookup will say so */
	*mtu = dev_mtu - sizeof(struct ipv6hdr);
	if (rc == BPF_MTU_CHK_RET_FRAG_NEEDED)
		return 1;
	if (skb->gso_size) {
		__u32 seg = skb->gso_size + (p->l4_off - p->l3_off) + l4_header_len(skb, p);
		return seg > *mtu;
	}
	return 0;
}

/* is_icmp_error tells whether the packet is itself an ICMP error, which
 * never earns another (RFC 1122, RFC 4443) and never opens a flow. */
static __always_inline int is_icmp_error(struct pkt *p)
{
	if (p->proto == IPPROTO_ICMP)
		return p->icmp_type == 3 || p->icmp_type == 11 || p->icmp_type == 12;
	if (p->proto == IPPROTO_ICMPV6)
		return p->icmp_type < 128;
	return 0;
}

/* send_fib sends the packet out of the underlay to dst, resolved by the
 * node's FIB (its underlay routes), counting what under fwd. */
/* RET_ENCAPSULATED: encap wrapped the packet, which is to be sent. */
#define RET_ENCAPSULATED 0x7004

/* A TCP reset sent ahead of the packet, on its path (send_fib): seq is
 * the reset's sequence number (network order), l4_off the TCP header's
 * offset in the packet as it leaves; l4_off 0 sends none. */
struct reset_ahead {
	__u32 seq;
	__u32 l4_off;
};

/* tcp_reset_clone sends a copy of the TCP segment at l4_off turned into a
 * bare reset (no options: the option bytes ride as payload, which a reset
 * ignores, and no timestamp it could be refused by) with sequence number
 * seq, out of ifindex ahead of the segment itself, which it restores.
 * Global: verified once, not on every path to each send. */
__attribute__((noinline)) int tcp_reset_clone(struct __sk_buff *skb, __u32 l4_off, __u32 seq, __u32 ifindex)
{
	__u32 old_seq;
	__u16 old_word;
	__u16 rst_word = bpf_htons((5 << 12) | 0x04);
	__u32 csum = l4_off + 16;
	if (l4_off > 0xffff)
		return -1;
	if (bpf_skb_load_bytes(skb, l4_off + 4, &old_seq, 4) || bpf_skb_load_bytes(skb, l4_off + 12, &old_word, 2))
		return -1;
	/* The first helper makes the header writable: only it fails in
	 * practice. After any write, a failure is -2 (the packet is no longer
	 * the one to send). */
	if (bpf_l4_csum_replace(skb, csum, old_seq, seq, 4))
		return -1;
	if (bpf_skb_store_bytes(skb, l4_off + 4, &seq, 4, 0) || bpf_l4_csum_replace(skb, csum, old_word, rst_word, 2) ||
	    bpf_skb_store_bytes(skb, l4_off + 12, &rst_word, 2, 0))
		return -2;
	long rc = bpf_clone_redirect(skb, ifindex, 0);
	if (bpf_l4_csum_replace(skb, csum, seq, old_seq, 4) || bpf_skb_store_bytes(skb, l4_off + 4, &old_seq, 4, 0) ||
	    bpf_l4_csum_replace(skb, csum, rst_word, old_word, 2) || bpf_skb_store_bytes(skb, l4_off + 12, &old_word, 2, 0))
		return -2;
	return rc ? -1 : 0;
}

static __always_inline int send_fib_ahead(struct __sk_buff *skb, __u8 family, const __u8 *src, const __u8 *dst, __u32 what,
					  const struct reset_ahead *ra)
{
	struct lace_config *cfg = config();
	if (!cfg)
		return drop(DROP_FIB);
	struct bpf_fib_lookup fib = {};
	fib.ifindex = cfg->underlay_ifindex;
	/* tot_len stays 0: the kernel then checks the MTU against the skb
	 * itself, which understands GSO; a tot_len of a 64 KB GSO packet would
	 * answer FRAG_NEEDED. */
	if (family == LACE_FAMILY_V4) {
		fib.family = AF_INET;
		__builtin_memcpy(&fib.ipv4_src, src, 4);
		__builtin_memcpy(&fib.ipv4_dst, dst, 4);
	} else {
		fib.family = AF_INET6;
		__builtin_memcpy(fib.ipv6_src, src, 16);
		__builtin_memcpy(fib.ipv6_dst, dst, 16);
	}
	long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		if (set_macs(skb, fib.dmac, fib.smac))
			return drop(DROP_ADJUST);
		if (ra && ra->l4_off) {
			/* A reset that cannot be restored from leaves a packet
			 * nobody meant to send: dropped. One not sent is only
			 * counted: the segment still goes. */
			int r = tcp_reset_clone(skb, ra->l4_off, ra->seq, fib.ifindex);
			if (r == -2)
				return drop(DROP_ADJUST);
			count(r ? FWD_RESET_AHEAD_FAILED : FWD_RESET_AHEAD);
		}
		count(what);
		return bpf_redirect(fib.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		/* The kernel resolves the neighbour and queues the packet (no
		 * reset ahead: the neighbour is not known yet, and a port
		 * reused toward an endpoint was used toward it before). */
		count(what);
		return bpf_redirect_neigh(fib.ifindex, 0, 0, 0);
	}
	return drop(DROP_FIB);
}

static __always_inline int send_fib(struct __sk_buff *skb, __u8 family, const __u8 *src, const __u8 *dst, __u32 what)
{
	return send_fib_ahead(skb, family, src, dst, what, 0);
}

/* encap_and_send encapsulates the packet in SRv6 to sid. A packet from a
 * pod that cannot cross the underlay earns the pod an ICMP error
 * (icmp_back: RET_TOO_BIG with p->mtu set, the program sends it); one from
 * the underlay is dropped and counted. */
static __noinline __attribute__((unused)) int encap(struct __sk_buff *skb, struct pkt *p, const __u8 *sid, int icmp_back)
{
	struct lace_config *cfg = config();
	if (!cfg)
		return drop(DROP_FIB);
	__u32 mtu = 0;
	if (too_big(skb, p, cfg->underlay_ifindex, &mtu)) {
		if (!icmp_back || is_icmp_error(p))
			return drop(DROP_MTU);
		p->mtu = mtu;
		return RET_TOO_BIG;
	}
	__u32 inner_len = skb->len - ETH_HLEN;
	__u32 flow = bpf_get_hash_recalc(skb) & 0xfffff;

	/* ENCAP_L3_IPV6 keeps GSO metadata consistent; FIXED_GSO keeps the
	 * segment size, which the pod MTU already leaves room for. Without
	 * them TSO packets are dropped and TCP stalls. */
	if (bpf_skb_adjust_room(skb, sizeof(struct ipv6hdr), BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_FIXED_GSO))
		return drop(DROP_ADJUST);

	struct ipv6hdr outer = {};
	outer.version = 6;
	/* The outer traffic class copies the inner DSCP and ECN (RFC 6040
	 * normal mode), so the fabric queues and marks the flow as the pod
	 * asked. */
	outer.priority = p->tos >> 4;
	outer.flow_lbl[0] = ((p->tos & 0x0f) << 4) | ((flow >> 16) & 0x0f);
	outer.flow_lbl[1] = (flow >> 8) & 0xff;
	outer.flow_lbl[2] = flow & 0xff;
	outer.payload_len = bpf_htons(inner_len);
	outer.nexthdr = p->family == LACE_FAMILY_V4 ? IPPROTO_IPIP : IPPROTO_IPV6;
	outer.hop_limit = 64;
	__builtin_memcpy(&outer.saddr, cfg->underlay_ip6, 16);
	__builtin_memcpy(&outer.daddr, sid, 16);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &outer, sizeof(outer), 0))
		return drop(DROP_ADJUST);
	__u16 proto = bpf_htons(ETH_P_IPV6);
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, 2, 0))
		return drop(DROP_ADJUST);
	/* The node's own SRv6, for to_underlay. */
	skb->mark = LACE_MARK_ENCAP;
	return RET_ENCAPSULATED;
}

/* encap_and_send_ahead: encap, then send, with a reset ahead (ra, its
 * l4_off before the encapsulation). Apart, so that the reset's frame
 * does not stack on encap's. */
static __always_inline __attribute__((unused)) int encap_and_send_ahead(struct __sk_buff *skb, struct pkt *p, const __u8 *sid, int icmp_back,
									 struct reset_ahead *ra)
{
	int rc = encap(skb, p, sid, icmp_back);
	if (rc != RET_ENCAPSULATED)
		return rc;
	struct lace_config *cfg = config();
	if (!cfg)
		return drop(DROP_FIB);
	if (ra && ra->l4_off)
		ra->l4_off += sizeof(struct ipv6hdr);
	return send_fib_ahead(skb, LACE_FAMILY_V6, cfg->underlay_ip6, sid, FWD_ENCAP, ra);
}

static __noinline __attribute__((unused)) int encap_and_send(struct __sk_buff *skb, struct pkt *p, const __u8 *sid, int icmp_back)
{
	return encap_and_send_ahead(skb, p, sid, icmp_back, 0);
}

/* L4 checksum offsets: TCP, UDP, ICMP and ICMPv6. */
static __always_inline __u32 l4_csum_off(struct pkt *p)
{
	if (p->proto == IPPROTO_TCP)
		return p->l4_off + 16;
	if (p->proto == IPPROTO_UDP)
		return p->l4_off + 6;
	return p->l4_off + 2;
}

/* nat_rewrite_l3 replaces the source (is_src) or destination address of
 * a later fragment: it has no L4 header, and the first fragment's
 * checksum, over the whole datagram, took the change. */
static __always_inline int nat_rewrite_l3(struct __sk_buff *skb, struct pkt *p, int is_src, const __u8 *addr)
{
	__u8 *old = is_src ? p->saddr : p->daddr;
	if (p->family == LACE_FAMILY_V4) {
		__u32 o = *(__u32 *)old, n = *(__u32 *)addr;
		if (bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check), o, n, 4))
			return -1;
		return bpf_skb_store_bytes(skb, p->l3_off + (is_src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr)), &n, 4, 0);
	}
	return bpf_skb_store_bytes(skb, p->l3_off + (is_src ? offsetof(struct ipv6hdr, saddr) : offsetof(struct ipv6hdr, daddr)), addr, 16, 0);
}

/* nat_rewrite replaces the source (is_src) or destination address and
 * port (ICMP echo: identifier) of p with addr and port, keeping the IP
 * and L4 checksums right (incremental, so checksum offload still works). */
static __always_inline int nat_rewrite(struct __sk_buff *skb, struct pkt *p, int is_src, const __u8 *addr, __u16 port)
{
	__u32 csum = l4_csum_off(p);
	__u64 mangled = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	int l4_pseudo = p->proto != IPPROTO_ICMP; /* ICMPv4 has no pseudo header */
	if (p->frag == PKT_FRAG_LATER)
		return nat_rewrite_l3(skb, p, is_src, addr);
	__u8 *old = is_src ? p->saddr : p->daddr;
	if (p->family == LACE_FAMILY_V4) {
		__u32 off = p->l3_off + (is_src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr));
		__u32 o = *(__u32 *)old, n = *(__u32 *)addr;
		if (bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check), o, n, 4))
			return -1;
		if (l4_pseudo && bpf_l4_csum_replace(skb, csum, o, n, BPF_F_PSEUDO_HDR | mangled | 4))
			return -1;
		if (bpf_skb_store_bytes(skb, off, &n, 4, 0))
			return -1;
	} else {
		__u32 off = p->l3_off + (is_src ? offsetof(struct ipv6hdr, saddr) : offsetof(struct ipv6hdr, daddr));
		/* old and addr live in the callers' frames: no copies here, the
		 * call chain's stack is tight. */
		__s64 diff = bpf_csum_diff((__be32 *)old, 16, (__be32 *)addr, 16, 0);
		if (bpf_l4_csum_replace(skb, csum, 0, diff, BPF_F_PSEUDO_HDR | mangled))
			return -1;
		if (bpf_skb_store_bytes(skb, off, addr, 16, 0))
			return -1;
	}
	__u16 oldport;
	__u32 poff;
	if (p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP) {
		oldport = is_src ? p->sport : p->dport;
		poff = p->l4_off + (is_src ? 0 : 2);
	} else {
		oldport = p->sport; /* the echo identifier */
		poff = p->l4_off + 4;
	}
	if (oldport == port)
		return 0;
	if (bpf_l4_csum_replace(skb, csum, oldport, port, mangled | 2))
		return -1;
	return bpf_skb_store_bytes(skb, poff, &port, 2, 0);
}

/* unnat_reply restores the VIP and port a client addressed on a reply
 * from the service endpoint its flow was translated to (ct is the
 * client's entry, found at delivery). */
static __always_inline int unnat_reply(struct __sk_buff *skb, struct pkt *p, struct ct_val *ct)
{
	if (!ct || (ct->flags & (CT_DNAT | CT_ORIGIN_LOCAL)) != (CT_DNAT | CT_ORIGIN_LOCAL))
		return 0;
	__u8 vip[16];
	__builtin_memcpy(vip, ct->nat_addr, 16);
	__u16 port = ct->nat_port;
	return nat_rewrite(skb, p, 1, vip, port);
}

/* local_pod finds the pod holding addr in network net_id on this node:
 * its host-side veth and the MACs a frame to it carries (pod, host).
 * Copied out of the map value, which a concurrent update may change. */
static __always_inline int local_pod(__u32 net_id, __u8 family, const __u8 *addr, __u32 *ifindex, __u8 *macs)
{
	struct ep_key ek = {.net_id = net_id, .family = family};
	__builtin_memcpy(ek.addr, addr, 16);
	struct ep_val *ep = bpf_map_lookup_elem(&lace_endpoints, &ek);
	if (!ep)
		return -1;
	*ifindex = ep->ifindex;
	__builtin_memcpy(macs, ep->pod_mac, 6);
	__builtin_memcpy(macs + 6, ep->host_mac, 6);
	return 0;
}

/* icmp_in_refused tells whether an ICMP error p toward a local pod of
 * network net_id, from network src_net, is about nothing of the pod's
 * with that sender. The error quotes a packet the pod sent: its source is
 * the pod (the error's destination) and its tuple, seen from the pod, a
 * live flow of the pod. The flow's peer must be the sender: the peer's
 * address in the same network, or, for a flow whose remote side is
 * outside the cluster, any outside source (a router on the path sends fragmentation needed or time
 * exceeded from its own address, which may classify into another external
 * network than the flow's peer). Otherwise a host on the fabric, or a pod
 * of another network, could abort the pod's connects or lower its path MTU
 * by quoting its flows. Called where errors enter from another node
 * (decap) or from the fabric (from_outside); a pod's error to a pod of the
 * same node was checked against the sender's own flow (quoted_key,
 * pod.c), and from_pod's chain has no stack left for this frame. */
static __noinline __attribute__((unused)) int icmp_in_refused(struct __sk_buff *skb, struct pkt *p, __u32 net_id, __u32 src_net)
{
	/* Loaded field by field into the key: a small frame. */
	union {
		struct ct_key k;
		struct class_key ck; /* after the lookup, the same room */
	} u = {.k = {.net_id = net_id, .family = p->family}};
	struct ct_key *kp = &u.k;
	__u32 off = p->l4_off + 8;
	__u8 b = 0;
	if (bpf_skb_load_bytes(skb, off, &b, 1))
		return 1;
	if (p->family == LACE_FAMILY_V4) {
		if (bpf_skb_load_bytes(skb, off + 9, &kp->proto, 1) || bpf_skb_load_bytes(skb, off + 12, kp->laddr, 4) ||
		    bpf_skb_load_bytes(skb, off + 16, kp->raddr, 4))
			return 1;
		off += (b & 0x0f) * 4;
	} else {
		if (bpf_skb_load_bytes(skb, off + 6, &kp->proto, 1) || bpf_skb_load_bytes(skb, off + 8, kp->laddr, 16) ||
		    bpf_skb_load_bytes(skb, off + 24, kp->raddr, 16))
			return 1;
		off += 40;
	}
	if (!eq16(kp->laddr, p->daddr))
		return 1; /* not a packet of this pod */
	if (kp->proto == IPPROTO_TCP || kp->proto == IPPROTO_UDP) {
		if (bpf_skb_load_bytes(skb, off, &kp->lport, 4)) /* lport, rport */
			return 1;
	} else if (kp->proto == IPPROTO_ICMP || kp->proto == IPPROTO_ICMPV6) {
		if (bpf_skb_load_bytes(skb, off + 4, &kp->lport, 2)) /* an echo's identifier */
			return 1;
		kp->rport = kp->lport;
	} else {
		return 1;
	}
	struct ct_val *ct = ct_lookup(kp);
	/* A pod's side of its flow to a VIP or an external frontend
	 * (CT_SERVICE): to_service translated every packet of it here, so
	 * nobody beyond this node saw that address, and an error naming it
	 * is forged (its remote, a LoadBalancer address, is no inside one
	 * and would pass as an outside flow below). */
	if (!ct || (ct->flags & CT_SERVICE))
		return 1;
	/* The peer itself, in the flow's network. Not any source of that
	 * network: over SRv6 an outside inner source is not checked
	 * (foreign_source checks pods), so any node could otherwise speak
	 * about flows between pods of two others. */
	if (ct->peer_net == src_net && eq16(kp->raddr, p->saddr))
		return 0;
	/* An outside flow, an outside sender: a router on its path. */
	struct class_key *ck = &u.ck;
	__builtin_memcpy(ck->addr, kp->raddr, 16); /* bytes 8-23 from 28-43 */
	ck->prefixlen = 32 + 128;
	ck->family = p->family;
	ck->pad[0] = ck->pad[1] = ck->pad[2] = 0;
	if (bpf_map_lookup_elem(&lace_inside, ck))
		return 1;
	__builtin_memcpy(ck->addr, p->saddr, 16);
	return bpf_map_lookup_elem(&lace_inside, ck) != NULL;
}

/* deliver hands the packet to the pod holding its destination in network
 * dst_net on this node, recording the flow (from src_net) so the pod's
 * replies go back in that context. decide (a constant) says whether the
 * pod's ingress policies may be asked: not on the paths that carry only
 * replies, whose call chains have no stack left for them. */
static __always_inline int deliver(struct __sk_buff *skb, struct pkt *p, __u32 dst_net, __u32 src_net, __u32 what,
				   int decide)
{
	__u32 ifindex;
	__u8 macs[12];
	if (local_pod(dst_net, p->family, p->daddr, &ifindex, macs))
		return drop(DROP_NO_ENDPOINT);
	struct ct_val *ct;
	int rc = ct_track_in(dst_net, src_net, p, is_icmp_error(p), decide ? ifindex : 0, &ct);
	if (rc)
		return drop(rc);
	if (dec_ttl(skb, p) || unnat_reply(skb, p, ct) || set_macs(skb, macs, macs + 6))
		return drop(DROP_ADJUST);
	count(what);
	return bpf_redirect_peer(ifindex, 0);
}

/* deliver_local delivers a packet of any flow (deliver). */
static __noinline __attribute__((unused)) int deliver_local(struct __sk_buff *skb, struct pkt *p, __u32 dst_net, __u32 src_net, __u32 what)
{
	return deliver(skb, p, dst_net, src_net, what, 1);
}

/* deliver_answer delivers a reply to a flow the pod opened (deliver):
 * its own egress policies decided that flow. */
static __noinline __attribute__((unused)) int deliver_answer(struct __sk_buff *skb, struct pkt *p, __u32 dst_net, __u32 src_net, __u32 what)
{
	return deliver(skb, p, dst_net, src_net, what, 0);
}

/* snat_out sends a pod's packet to an external network from the node's
 * underlay address and a port of the node (kept per flow in conntrack and
 * reversed by snat_in): raw, possibly overlapping pod addresses never
 * reach the fabric. */
static __noinline __attribute__((unused)) int snat_out(struct __sk_buff *skb, struct pkt *p, struct ct_key *k, __u32 ext_net)
{
	__u32 net_id = k->net_id;
	struct lace_config *cfg = config();
	if (!cfg)
		return drop(DROP_FIB);
	__u8 node[16] = {};
	if (p->family == LACE_FAMILY_V4) {
		if (!(cfg->flags & LACE_CFG_HAS_V4))
			return drop(DROP_FIB);
		__builtin_memcpy(node, cfg->underlay_ip4, 4);
	} else {
		__builtin_memcpy(node, cfg->underlay_ip6, 16);
	}
	int icmp = p->proto == IPPROTO_ICMP || p->proto == IPPROTO_ICMPV6;
	if (!(p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP ||
	      (icmp && (p->icmp_type == 8 || p->icmp_type == 128))))
		return drop(DROP_SNAT); /* nothing to tell its replies apart by */

	struct ct_val *ct = ct_lookup(k);
	__u16 port = 0;
	struct snat_key sk = {.family = p->family, .proto = p->proto, .rport = icmp ? 0 : p->dport};
	__builtin_memcpy(sk.raddr, p->daddr, 16);
	struct snat_val sv = {.net_id = net_id, .lport = p->sport};
	__builtin_memcpy(sv.laddr, p->saddr, 16);
	int held = ct && (ct->flags & CT_SNAT) && !(is_tcp_syn(p) && ct_closing(ct));
	if (held) {
		/* The mapping the replies need (the agent's sweep removes only
		 * those of flows that are over; put back if it raced). A port
		 * another flow holds now is never shared: that flow gets the
		 * replies, this one is over. Unless nothing answered this one
		 * yet and p could open it (a SYN, a datagram, an echo): it
		 * lost a race for the port (below), and takes another. Dropped,
		 * the SYN's retransmissions all were, and the connect timed
		 * out. */
		sk.port = ct->snat_port;
		struct snat_val *cur = bpf_map_lookup_elem(&lace_snat, &sk);
		if (!cur) {
			bpf_map_update_elem(&lace_snat, &sk, &sv, BPF_NOEXIST);
		} else if (!snat_same(cur, &sv)) {
			if ((ct->flags & CT_SEEN_REPLY) || (p->proto == IPPROTO_TCP && !is_tcp_syn(p)))
				return drop(DROP_SNAT_CLOSED);
			held = 0;
		}
	}
	if (held) {
		port = ct->snat_port;
		ct_refresh(ct, p, 1);
	} else {
		/* Only a SYN opens a TCP flow: a pod's answer to a flow whose
		 * entry is gone (a flood's SYN evicted from lace_ct_new before
		 * the pod answered it) would otherwise take a port and an
		 * established entry for a minute. */
		if (p->proto == IPPROTO_TCP && !is_tcp_syn(p))
			return drop(DROP_NO_FLOW);
		/* A port is free when no live flow holds it: never used, its
		 * flow's conntrack entry expired or evicted, or (TCP) that
		 * flow closed by its pod's reset, whose port a new connection
		 * takes at once, or by FINs both ways, taken once silent
		 * SNAT_PORT_QUIET (its last ACK passed), as Linux's NAT reuses
		 * the tuple of a closed connection (a reset from outside, which
		 * anybody can forge, frees it only at expiry: ct_port_free).
		 * lace_snat is no LRU: when it is full, no port is free. */
		struct ct_key ok;
		__u32 h = bpf_get_prandom_u32();
		int found = 0;
		/* A mapping of another flow that is over was replaced: ok
		 * keeps that flow's key (snat_owner). */
		int took = 0;
		for (int i = 0; i < SNAT_TRIES; i++) {
			port = bpf_htons(SNAT_PORT_MIN + (h + i) % SNAT_PORT_RANGE);
			sk.port = port;
			if (!bpf_map_update_elem(&lace_snat, &sk, &sv, BPF_NOEXIST)) {
				found = 1;
				break;
			}
			struct snat_val *cur = bpf_map_lookup_elem(&lace_snat, &sk);
			if (!cur)
				continue;
			if (!snat_same(cur, &sv)) {
				struct ct_val *owner = snat_owner(&sk, cur, &ok);
				if (owner && !(p->proto == IPPROTO_TCP && ct_port_free(owner)))
					continue;
				took = 1;
			}
			bpf_map_update_elem(&lace_snat, &sk, &sv, BPF_ANY);
			found = 1;
			break;
		}
		if (!found) {
			snat_exhausted(&sk);
			return drop(DROP_SNAT);
		}
		if (ct && !(is_tcp_syn(p) && ct_closing(ct))) {
			/* A service flow to an outside endpoint: its DNAT stays. */
			ct->flags |= CT_SNAT;
			ct->snat_port = port;
			ct->peer_net = ext_net;
			ct_refresh(ct, p, 1);
		} else {
			ct_create(k, ext_net, CT_ORIGIN_LOCAL | CT_SNAT, port, p, 1);
		}
		/* The map has no compare and swap: another new flow may have
		 * judged the port free at the same moment, its entry not
		 * written yet, and the later mapping wins. Checked once this
		 * flow's entry names the port (a later judge sees it live): if
		 * the mapping is not this flow's, or the flow it replaced has
		 * an entry naming the port now (it was that other new flow),
		 * the port is the other's, and this packet goes nowhere, so
		 * nothing answered from the port can be this flow's. Its next
		 * SYN or datagram takes another port (above). */
		struct snat_val *won = bpf_map_lookup_elem(&lace_snat, &sk);
		if (!snat_same(won, &sv))
			return drop(DROP_SNAT_RACE);
		if (took) {
			struct ct_val *owner = ct_lookup(&ok);
			if (owner && (owner->flags & CT_SNAT) && owner->snat_port == port &&
			    !(p->proto == IPPROTO_TCP && ct_port_free(owner))) {
				/* Given back: the mapping that other flow wrote,
				 * while the mapping is still this flow's (never
				 * over a third flow's). */
				if (snat_same(bpf_map_lookup_elem(&lace_snat, &sk), &sv)) {
					sv.net_id = ok.net_id;
					sv.lport = ok.lport;
					__builtin_memcpy(sv.laddr, ok.laddr, 16);
					bpf_map_update_elem(&lace_snat, &sk, &sv, BPF_ANY);
				}
				return drop(DROP_SNAT_RACE);
			}
		}
	}
	if (dec_ttl(skb, p) || nat_rewrite(skb, p, 1, node, port))
		return drop(DROP_ADJUST);
	return send_fib(skb, p->family, node, p->daddr, FWD_SNAT);
}

#endif
