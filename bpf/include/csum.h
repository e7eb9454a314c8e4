/* Checksum helpers: folding a computed sum, and the header rewrite whose
 * checksum bpf_l3_csum_replace follows (the TTL). The L4 rewrites of NAT
 * are fwd.h's (nat_rewrite), the ICMP errors' sums icmp.h's. Included by
 * lace.h. */
#ifndef LACE_CSUM_H
#define LACE_CSUM_H

#include "parse.h"

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u64 s = (__u64)sum;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return ~(__u16)s;
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

#endif
