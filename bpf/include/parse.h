/* Packet parsing: the IP and L4 headers of a packet into struct pkt,
 * whose addresses every program compares as 16 bytes (IPv4 in the first
 * 4). Included by lace.h. */
#ifndef LACE_PARSE_H
#define LACE_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/icmpv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

/* pkt.family, and the family byte of every map key. */
#define LACE_FAMILY_V4 4
#define LACE_FAMILY_V6 6

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

/* ipv6_ext_header tells whether an IPv6 next header is an extension
 * header (parsing stops at the first one but a fragment header). */
static __always_inline int ipv6_ext_header(__u8 nexthdr)
{
	switch (nexthdr) {
	case 0:   /* hop-by-hop options */
	case 43:  /* routing (an SRH: reduced encapsulation carries none) */
	case 50:  /* ESP */
	case 51:  /* AH */
	case 60:  /* destination options */
	case 135: /* mobility */
	case 139: /* HIP */
	case 140: /* shim6 */
		return 1;
	}
	return 0;
}

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
	/* SCTP's common header starts with its ports, as UDP's. */
	if (p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP || p->proto == IPPROTO_SCTP) {
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

#endif
