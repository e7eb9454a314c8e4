/* L2 announcement of LoadBalancer VIPs: the node the agents chose for a
 * VIP answers ARP and neighbour solicitations for it on its underlay, from
 * here, with the underlay's MAC. An entry lives until its deadline, which
 * the agent renews while it announces: a node whose agent died stops
 * answering within that time by itself, so another node's takeover never
 * meets two answers for long. */
#ifndef LACE_ANNOUNCE_H
#define LACE_ANNOUNCE_H

#include "lace.h"
#include "neigh.h"

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
	struct arp_msg m;
	if (arp_read(skb, &m) || m.oper != ARP_REQUEST)
		return TC_ACT_OK;
	/* Another host announcing the address itself (gratuitous) is no
	 * question. */
	if (eq4(m.tpa, m.spa))
		return TC_ACT_OK;
	struct announce_val *av = announced(LACE_FAMILY_V4, m.tpa);
	if (!av)
		return TC_ACT_OK;
	__u8 mac[6];
	__builtin_memcpy(mac, av->mac, 6);
	if (arp_reply(skb, &m, mac))
		return TC_ACT_OK;
	count(FWD_ANNOUNCE);
	return bpf_redirect(skb->ifindex, 0);
}

/* ns_answer turns a neighbour solicitation for an announced VIP into a
 * solicited advertisement (override set, the underlay's MAC as the target
 * link-layer address) and sends it back out of the interface. Duplicate
 * address detection (unspecified source) is not answered: the address is
 * no interface's. */
static __noinline int ns_answer(struct __sk_buff *skb)
{
	struct ns_msg m;
	if (ns_read(skb, &m) || ns_is_dad(&m))
		return TC_ACT_OK;
	struct announce_val *av = announced(LACE_FAMILY_V6, m.target);
	if (!av)
		return TC_ACT_OK;
	__u8 mac[6];
	__builtin_memcpy(mac, av->mac, 6);
	if (na_reply(skb, &m, mac, 0))
		return drop(DROP_ADJUST);
	count(FWD_ANNOUNCE);
	return bpf_redirect(skb->ifindex, 0);
}

#endif
