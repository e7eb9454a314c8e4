/* Answering address resolution from the data plane: an ARP request turned
 * into its reply, a neighbour solicitation into a solicited advertisement,
 * in place in the asker's frame, sent back the way it came. What is
 * answered for which address is the caller's: the announcer answers for
 * the LoadBalancer VIPs its node holds (announce.h), an l2 port for the
 * addresses of its network (l2.c). */
#ifndef LACE_NEIGH_H
#define LACE_NEIGH_H

#include "lace.h"

#define ETH_P_ARP_ 0x0806
#define ETH_P_RARP_ 0x8035

struct arp_eth4 {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 oper;
	__u8 sha[6];
	__u8 spa[4];
	__u8 tha[6];
	__u8 tpa[4];
} __attribute__((packed));

#define ARP_REQUEST 1
#define ARP_REPLY 2

/* An IPv4-over-Ethernet ARP message's fields, read out of the frame. */
struct arp_msg {
	__u16 oper;
	__u8 sha[6];
	__u8 spa[4];
	__u8 tpa[4];
};

/* arp_read reads the ARP message after the Ethernet header; -1: no
 * IPv4-over-Ethernet ARP. */
static __always_inline int arp_read(struct __sk_buff *skb, struct arp_msg *m)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct arp_eth4 *arp = data + ETH_HLEN;
	if ((void *)(arp + 1) > end)
		return -1;
	if (arp->htype != bpf_htons(1) || arp->ptype != bpf_htons(ETH_P_IP) || arp->hlen != 6 || arp->plen != 4)
		return -1;
	m->oper = bpf_ntohs(arp->oper);
	__builtin_memcpy(m->sha, arp->sha, 6);
	__builtin_memcpy(m->spa, arp->spa, 4);
	__builtin_memcpy(m->tpa, arp->tpa, 4);
	return 0;
}

/* arp_reply rewrites the request m was read from into the reply that mac
 * holds its target address, addressed to the asker. */
static __always_inline int arp_reply(struct __sk_buff *skb, const struct arp_msg *m, const __u8 *mac)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct arp_eth4 *arp = (void *)(eth + 1);
	if ((void *)(arp + 1) > end)
		return -1;
	__builtin_memcpy(eth->h_dest, m->sha, 6);
	__builtin_memcpy(eth->h_source, mac, 6);
	arp->oper = bpf_htons(ARP_REPLY);
	__builtin_memcpy(arp->tha, m->sha, 6);
	__builtin_memcpy(arp->tpa, m->spa, 4);
	__builtin_memcpy(arp->sha, mac, 6);
	__builtin_memcpy(arp->spa, m->tpa, 4);
	return 0;
}

/* The neighbour advertisement na_reply writes: ICMPv6 header, target and
 * the target link-layer address option. */
struct na_msg {
	__u8 type;
	__u8 code;
	__u16 csum;
	__be32 flags;
	__u8 target[16];
	__u8 opt_type;
	__u8 opt_len;
	__u8 mac[6];
};

/* The IPv6 pseudo header and the advertisement, summed as one. */
struct na_sum {
	__u8 saddr[16];
	__u8 daddr[16];
	__be32 len;
	__be32 nexthdr;
	struct na_msg na;
};

#define NA_ROUTER 0x80000000
#define NA_SOLICITED 0x40000000
#define NA_OVERRIDE 0x20000000

/* A neighbour solicitation's fields. */
struct ns_msg {
	__u8 saddr[16];
	__u8 target[16];
	__u8 smac[6];
};

/* ns_read reads a neighbour solicitation (hop limit 255, as RFC 4861
 * requires of one from on-link); -1: none. One from the unspecified
 * address is duplicate address detection (ns_is_dad): the caller
 * decides. */
static __always_inline int ns_read(struct __sk_buff *skb, struct ns_msg *m)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	__u8 *icmp = (void *)(ip6 + 1);
	if ((void *)(icmp + 24) > end)
		return -1;
	if (eth->h_proto != bpf_htons(ETH_P_IPV6) || ip6->nexthdr != IPPROTO_ICMPV6 || icmp[0] != 135 || icmp[1] != 0 ||
	    ip6->hop_limit != 255)
		return -1;
	__builtin_memcpy(m->target, icmp + 8, 16);
	__builtin_memcpy(m->saddr, &ip6->saddr, 16);
	__builtin_memcpy(m->smac, eth->h_source, 6);
	return 0;
}

static __always_inline int ns_is_dad(const struct ns_msg *m)
{
	const __u32 *s = (const __u32 *)m->saddr;
	return !(s[0] | s[1] | s[2] | s[3]);
}

/* na_reply turns the solicitation m was read from into the solicited
 * advertisement that mac holds its target (flags: NA_ROUTER or 0, beside
 * solicited and override), addressed to the asker. */
static __noinline int na_reply(struct __sk_buff *skb, const struct ns_msg *m, const __u8 *mac, __u32 flags)
{
	struct na_sum s = {};
	__builtin_memcpy(s.na.target, m->target, 16);
	__builtin_memcpy(s.daddr, m->saddr, 16);
	__builtin_memcpy(s.saddr, m->target, 16);
	__builtin_memcpy(s.na.mac, mac, 6);
	s.len = bpf_htonl(sizeof(struct na_msg));
	s.nexthdr = bpf_htonl(IPPROTO_ICMPV6);
	s.na.type = 136;
	s.na.flags = bpf_htonl(flags | NA_SOLICITED | NA_OVERRIDE);
	s.na.opt_type = 2;
	s.na.opt_len = 1;
	s.na.csum = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&s, sizeof(s), 0));

	__u32 len = ETH_HLEN + sizeof(struct ipv6hdr) + sizeof(struct na_msg);
	if (bpf_skb_change_tail(skb, len, 0))
		return -1;
	struct ethhdr e = {.h_proto = bpf_htons(ETH_P_IPV6)};
	__builtin_memcpy(e.h_dest, m->smac, 6);
	__builtin_memcpy(e.h_source, mac, 6);
	struct ipv6hdr h = {.version = 6, .nexthdr = IPPROTO_ICMPV6, .hop_limit = 255,
			    .payload_len = bpf_htons(sizeof(struct na_msg))};
	__builtin_memcpy(&h.saddr, s.saddr, 16);
	__builtin_memcpy(&h.daddr, s.daddr, 16);
	if (bpf_skb_store_bytes(skb, 0, &e, sizeof(e), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(h), &s.na, sizeof(s.na), 0))
		return -1;
	return 0;
}

#endif
