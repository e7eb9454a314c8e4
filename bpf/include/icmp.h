/* ICMP errors the node sends back to a pod, built in place from the packet
 * that caused them: time exceeded when the TTL or hop limit runs out, and
 * fragmentation needed / packet too big when the packet cannot cross the
 * underlay, so that traceroute shows the node and path MTU discovery
 * works instead of a silent black hole. The error quotes the offending
 * packet's IP header and first 24 bytes of payload (RFC 792 asks for 8,
 * RFC 4443 for as much as fits: the ports and, for TCP, the sequence
 * number a receiver checks; 24 because a packet whose checksum the pod
 * left to offload cannot be cut shorter than its L4 checksum field),
 * comes from the node's underlay address, and goes back into the pod
 * through the veth it came from. */

/* Bytes of payload quoted after the offending IP header. */
#define ICMP_QUOTE_L4 24
#ifndef LACE_ICMP_H
#define LACE_ICMP_H

#include "lace.h"
#include "ct.h"

/* From linux/icmp.h, which drags in libc's socket headers. */
#define ICMP_DEST_UNREACH 3
#define ICMP_FRAG_NEEDED 4
#define ICMP_TIME_EXCEEDED 11
#define ICMP_EXC_TTL 0
#define ICMP_PARAMETERPROB 12
#define ICMP_PORT_UNREACH 3
#define LACE_ICMPV6_PORT_UNREACH 4

struct icmp4hdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be16 unused;
	__be16 mtu; /* next-hop MTU of fragmentation needed (RFC 1191) */
};

enum icmp_kind {
	ICMP_KIND_TIME_EXCEEDED,
	ICMP_KIND_TOO_BIG,
	ICMP_KIND_PORT_UNREACH, /* from the packet's destination (a VIP without endpoints) */
};

struct icmp4_reply {
	struct iphdr ip;
	struct icmp4hdr icmp;
	__u8 quote[sizeof(struct iphdr) + ICMP_QUOTE_L4];
};
/* Naturally packed: the reply is written to the packet as it is, and its
 * checksummed parts are whole 32-bit words for bpf_csum_diff. */
_Static_assert(sizeof(struct icmp4_reply) == 20 + 8 + 20 + ICMP_QUOTE_L4, "icmp4_reply has padding");

struct icmp6_reply {
	struct ipv6hdr ip;
	struct icmp6hdr icmp;
	__u8 quote[sizeof(struct ipv6hdr) + ICMP_QUOTE_L4];
};
_Static_assert(sizeof(struct icmp6_reply) == 40 + 8 + 40 + ICMP_QUOTE_L4, "icmp6_reply has padding");

struct icmp6_pseudo {
	__u8 src[16];
	__u8 dst[16];
	__be32 len;
	__be32 next;
};

/* take_quote copies the first quote_len bytes after the Ethernet header
 * into quote and cuts the packet to them (a shorter packet is padded with
 * zeroes first: its IP header still says how long it was). */
static __always_inline int take_quote(struct __sk_buff *skb, void *quote, __u32 quote_len)
{
	__u32 want = ETH_HLEN + quote_len;
	if (skb->len < want && bpf_skb_change_tail(skb, want, 0))
		return -1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, quote, quote_len))
		return -1;
	return bpf_skb_change_tail(skb, want, 0);
}

/* reshape opens room for the new IP and ICMP headers before the quote and
 * addresses the packet back to the pod. */
static __always_inline int reshape(struct __sk_buff *skb, __u32 room, __u8 *macs)
{
	if (bpf_skb_adjust_room(skb, room, BPF_ADJ_ROOM_MAC, 0))
		return -1;
	/* Back to where it came from: the pod's MAC becomes the destination. */
	return set_macs(skb, macs + 6, macs);
}

static __always_inline int icmp4_error(struct __sk_buff *skb, struct pkt *p, enum icmp_kind kind, __u32 mtu)
{
	struct lace_config *cfg = config();
	if (!cfg || !(cfg->flags & LACE_CFG_HAS_V4))
		return -1;
	struct icmp4_reply r = {};
	__u8 macs[12];
	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)) || take_quote(skb, r.quote, sizeof(r.quote)))
		return -1;
	/* Options would shift the quoted payload; pods do not send them. */
	if ((r.quote[0] & 0x0f) != 5 || reshape(skb, sizeof(r.ip) + sizeof(r.icmp), macs))
		return -1;
	r.ip.version = 4;
	r.ip.ihl = 5;
	r.ip.tos = 0xc0; /* network control, as the kernel sends its errors */
	r.ip.tot_len = bpf_htons(sizeof(r));
	r.ip.ttl = 64;
	r.ip.protocol = IPPROTO_ICMP;
	/* A rejected service port answers from the VIP the client asked, as
	 * a host without the port would; routed-hop errors come from the
	 * node. */
	if (kind == ICMP_KIND_PORT_UNREACH)
		__builtin_memcpy(&r.ip.saddr, p->daddr, 4);
	else
		__builtin_memcpy(&r.ip.saddr, cfg->underlay_ip4, 4);
	__builtin_memcpy(&r.ip.daddr, p->saddr, 4);
	r.ip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&r.ip, sizeof(r.ip), 0));
	if (kind == ICMP_KIND_TOO_BIG) {
		r.icmp.type = ICMP_DEST_UNREACH;
		r.icmp.code = ICMP_FRAG_NEEDED;
		r.icmp.mtu = bpf_htons(mtu);
	} else if (kind == ICMP_KIND_PORT_UNREACH) {
		r.icmp.type = ICMP_DEST_UNREACH;
		r.icmp.code = ICMP_PORT_UNREACH;
	} else {
		r.icmp.type = ICMP_TIME_EXCEEDED;
		r.icmp.code = ICMP_EXC_TTL;
	}
	r.icmp.checksum = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&r.icmp, sizeof(r.icmp) + sizeof(r.quote), 0));
	return bpf_skb_store_bytes(skb, ETH_HLEN, &r, sizeof(r), 0);
}

static __always_inline int icmp6_error(struct __sk_buff *skb, struct pkt *p, enum icmp_kind kind, __u32 mtu)
{
	struct lace_config *cfg = config();
	if (!cfg)
		return -1;
	struct icmp6_reply r = {};
	__u8 macs[12];
	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)) || take_quote(skb, r.quote, sizeof(r.quote)) ||
	    reshape(skb, sizeof(r.ip) + sizeof(r.icmp), macs))
		return -1;
	r.ip.version = 6;
	r.ip.payload_len = bpf_htons(sizeof(r.icmp) + sizeof(r.quote));
	r.ip.nexthdr = IPPROTO_ICMPV6;
	r.ip.hop_limit = 64;
	const __u8 *from = kind == ICMP_KIND_PORT_UNREACH ? p->daddr : cfg->underlay_ip6;
	__builtin_memcpy(&r.ip.saddr, from, 16);
	__builtin_memcpy(&r.ip.daddr, p->saddr, 16);
	if (kind == ICMP_KIND_TOO_BIG) {
		r.icmp.icmp6_type = ICMPV6_PKT_TOOBIG;
		/* IPv6 links carry at least 1280 bytes (RFC 8200). */
		r.icmp.icmp6_mtu = bpf_htonl(mtu < 1280 ? 1280 : mtu);
	} else if (kind == ICMP_KIND_PORT_UNREACH) {
		r.icmp.icmp6_type = ICMPV6_DEST_UNREACH;
		r.icmp.icmp6_code = LACE_ICMPV6_PORT_UNREACH;
	} else {
		r.icmp.icmp6_type = ICMPV6_TIME_EXCEED;
		r.icmp.icmp6_code = ICMPV6_EXC_HOPLIMIT;
	}
	struct icmp6_pseudo ph = {.len = bpf_htonl(sizeof(r.icmp) + sizeof(r.quote)), .next = bpf_htonl(IPPROTO_ICMPV6)};
	__builtin_memcpy(ph.src, from, 16);
	__builtin_memcpy(ph.dst, p->saddr, 16);
	__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&r.icmp, sizeof(r.icmp) + sizeof(r.quote), sum);
	r.icmp.icmp6_cksum = csum_fold(sum);
	return bpf_skb_store_bytes(skb, ETH_HLEN, &r, sizeof(r), 0);
}

/* icmp_error turns the packet from a pod (which arrived on the host side
 * of its veth) into an ICMP error and sends it back into the pod; when
 * it cannot, the packet is dropped, counted under reason either way
 * (DROP_MAX: the caller counted it). The drop is told as the pod sent
 * it, before the packet becomes the error. */
static __noinline __attribute__((unused)) int icmp_error(struct __sk_buff *skb, struct pkt *p, enum icmp_kind kind, __u32 mtu, __u32 reason)
{
	if (reason < DROP_MAX)
		drop(reason);
	flow_note_tell(skb, p, FLOW_AT_POD_OUT);
	int err = p->family == LACE_FAMILY_V4 ? icmp4_error(skb, p, kind, mtu) : icmp6_error(skb, p, kind, mtu);
	if (err)
		return TC_ACT_SHOT;
	count(FWD_ICMP_ERROR);
	return bpf_redirect_peer(skb->ingress_ifindex, 0);
}

/* too_big_out turns a packet from the fabric that cannot cross it again
 * encapsulated (a flow to an external frontend whose endpoint is on
 * another node) into fragmentation needed / packet too big from the node,
 * sent back out of the interface it came in by: the outside host learns
 * the path MTU (its stack fragments its large datagrams smaller from then
 * on) instead of losing them silently. Counted too-big either way, and
 * told as the client sent it. */
static __noinline __attribute__((unused)) int too_big_out(struct __sk_buff *skb, struct pkt *p, __u32 mtu)
{
	drop(DROP_MTU);
	flow_note_tell(skb, p, FLOW_AT_NODE);
	int err = p->family == LACE_FAMILY_V4 ? icmp4_error(skb, p, ICMP_KIND_TOO_BIG, mtu)
					      : icmp6_error(skb, p, ICMP_KIND_TOO_BIG, mtu);
	if (err)
		return TC_ACT_SHOT;
	count(FWD_ICMP_ERROR);
	return bpf_redirect(skb->ingress_ifindex, 0);
}

#endif
