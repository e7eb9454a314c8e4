/* L2 announcement of LoadBalancer VIPs: the node the agents chose for a
 * VIP answers ARP and neighbour solicitations for it on its underlay, from
 * here, with the underlay's MAC. An entry lives until its deadline, which
 * the agent renews while it announces: a node whose agent died stops
 * answering within that time by itself, so another node's takeover never
 * meets two answers for long. */
#ifndef LACE_ANNOUNCE_H
#define LACE_ANNOUNCE_H

#include "lace.h"

struct announce_val {
	__u64 expires; /* bpf_ktime_get_ns() deadline */
	__u8 mac[6];   /* the underlay's */
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct host_key);
	__type(value, struct announce_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_announce SEC(".maps");

#define ETH_P_ARP_ 0x0806

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

/* announced returns the live entry of a VIP, or NULL. */
static __always_inline struct announce_val *announced(__u8 family, const __u8 *addr)
{
	struct host_key k = {.family = family};
	if (family == LACE_FAMILY_V4)
		__builtin_memcpy(k.addr, addr, 4);
	else
		__builtin_memcpy(k.addr, addr, 16);
	struct announce_val *v = bpf_map_lookup_elem(&lace_announce, &k);
	if (!v || v->expires < bpf_ktime_get_ns())
		return NULL;
	return v;
}

/* arp_answer turns an ARP request for an announced VIP into the reply and
 * sends it back out of the interface; anything else is the host's. */
static __noinline int arp_answer(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct arp_eth4 *arp = (void *)(eth + 1);
	if ((void *)(arp + 1) > end)
		return TC_ACT_OK;
	if (arp->htype != bpf_htons(1) || arp->ptype != bpf_htons(ETH_P_IP) || arp->hlen != 6 || arp->plen != 4 ||
	    arp->oper != bpf_htons(1))
		return TC_ACT_OK;
	__u8 vip[4], spa[4], sha[6];
	__builtin_memcpy(vip, arp->tpa, 4);
	__builtin_memcpy(spa, arp->spa, 4);
	__builtin_memcpy(sha, arp->sha, 6);
	/* Another host announcing the address itself (gratuitous) is no
	 * question. */
	if (eq4(vip, spa))
		return TC_ACT_OK;
	struct announce_val *av = announced(LACE_FAMILY_V4, vip);
	if (!av)
		return TC_ACT_OK;
	__u8 mac[6];
	__builtin_memcpy(mac, av->mac, 6);
	__builtin_memcpy(eth->h_dest, sha, 6);
	__builtin_memcpy(eth->h_source, mac, 6);
	arp->oper = bpf_htons(2);
	__builtin_memcpy(arp->tha, sha, 6);
	__builtin_memcpy(arp->tpa, spa, 4);
	__builtin_memcpy(arp->sha, mac, 6);
	__builtin_memcpy(arp->spa, vip, 4);
	count(FWD_ANNOUNCE);
	return bpf_redirect(skb->ifindex, 0);
}

/* The neighbour advertisement ns_answer writes: ICMPv6 header, target and
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

/* ns_answer turns a neighbour solicitation for an announced VIP into a
 * solicited advertisement (override set, the underlay's MAC as the target
 * link-layer address) and sends it back out of the interface. Duplicate
 * address detection (unspecified source) is not answered: the address is
 * no interface's. */
static __noinline int ns_answer(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	__u8 *icmp = (void *)(ip6 + 1);
	if ((void *)(icmp + 24) > end)
		return TC_ACT_OK;
	if (ip6->nexthdr != IPPROTO_ICMPV6 || icmp[0] != 135 || icmp[1] != 0 || ip6->hop_limit != 255)
		return TC_ACT_OK;
	struct na_sum s = {};
	__builtin_memcpy(s.na.target, icmp + 8, 16);
	__builtin_memcpy(s.daddr, &ip6->saddr, 16);
	const __u32 *src = (const __u32 *)s.daddr;
	if (!(src[0] | src[1] | src[2] | src[3]))
		return TC_ACT_OK;
	struct announce_val *av = announced(LACE_FAMILY_V6, s.na.target);
	if (!av)
		return TC_ACT_OK;
	__u8 peer[6];
	__builtin_memcpy(peer, eth->h_source, 6);
	__builtin_memcpy(s.saddr, s.na.target, 16);
	__builtin_memcpy(s.na.mac, av->mac, 6);
	s.len = bpf_htonl(sizeof(struct na_msg));
	s.nexthdr = bpf_htonl(IPPROTO_ICMPV6);
	s.na.type = 136;
	s.na.flags = bpf_htonl(0x60000000); /* solicited, override */
	s.na.opt_type = 2;
	s.na.opt_len = 1;
	s.na.csum = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&s, sizeof(s), 0));

	__u32 len = ETH_HLEN + sizeof(struct ipv6hdr) + sizeof(struct na_msg);
	if (bpf_skb_change_tail(skb, len, 0))
		return drop(DROP_ADJUST);
	struct ethhdr e = {.h_proto = bpf_htons(ETH_P_IPV6)};
	__builtin_memcpy(e.h_dest, peer, 6);
	__builtin_memcpy(e.h_source, s.na.mac, 6);
	struct ipv6hdr h = {.version = 6, .nexthdr = IPPROTO_ICMPV6, .hop_limit = 255,
			    .payload_len = bpf_htons(sizeof(struct na_msg))};
	__builtin_memcpy(&h.saddr, s.saddr, 16);
	__builtin_memcpy(&h.daddr, s.daddr, 16);
	if (bpf_skb_store_bytes(skb, 0, &e, sizeof(e), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(h), &s.na, sizeof(s.na), 0))
		return drop(DROP_ADJUST);
	count(FWD_ANNOUNCE);
	return bpf_redirect(skb->ifindex, 0);
}

#endif
