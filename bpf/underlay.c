//go:build ignore

/* from_underlay (tcx ingress of the node's underlay interface): SRv6
 * packets addressed to a SID inside this node's locator are checked (the
 * outer source must be a known node, the SID must name a known network),
 * decapsulated and delivered to the pod by bpf_redirect_peer. Everything
 * else continues to the host stack untouched. */
#include "lace.h"

SEC("tcx/ingress")
int from_underlay(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IPV6))
		return TC_ACT_OK;
	struct ipv6hdr *outer = (void *)(eth + 1);
	if ((void *)(outer + 1) > end)
		return TC_ACT_OK;
	struct lace_config *cfg = config();
	if (!cfg)
		return TC_ACT_OK;
	if (!eq8(&outer->daddr, cfg->locator))
		return TC_ACT_OK;

	__u8 *sid = (__u8 *)&outer->daddr;
	if (sid[SID_BEHAVIOUR_BYTE] != SID_L3_DECAP)
		return drop(DROP_DECAP_SID);
	__u32 net_id = ((__u32)sid[SID_NET_BYTE] << 24) | ((__u32)sid[SID_NET_BYTE + 1] << 16) |
		       ((__u32)sid[SID_NET_BYTE + 2] << 8) | sid[SID_NET_BYTE + 3];

	/* Only nodes of the cluster may inject into pods. */
	struct host_key src = {.family = LACE_FAMILY_V6};
	__builtin_memcpy(src.addr, &outer->saddr, 16);
	if (!bpf_map_lookup_elem(&lace_nodes, &src))
		return drop(DROP_DECAP_SOURCE);
	if (!bpf_map_lookup_elem(&lace_networks, &net_id))
		return drop(DROP_DECAP_SID);

	__u16 inner_proto;
	__u64 flags = BPF_F_ADJ_ROOM_NO_CSUM_RESET;
	if (outer->nexthdr == IPPROTO_IPIP) {
		inner_proto = bpf_htons(ETH_P_IP);
		flags |= LACE_ADJ_ROOM_DECAP_L3_IPV4;
	} else if (outer->nexthdr == IPPROTO_IPV6) {
		inner_proto = bpf_htons(ETH_P_IPV6);
		flags |= LACE_ADJ_ROOM_DECAP_L3_IPV6;
	} else {
		return drop(DROP_DECAP_PROTO);
	}
	struct pkt p = {};
	if (parse_ip(skb, inner_proto, ETH_HLEN + sizeof(struct ipv6hdr), &p))
		return drop(DROP_DECAP_PROTO);

	struct ep_key ek = {.net_id = net_id, .family = p.family};
	__builtin_memcpy(ek.addr, p.daddr, 16);
	struct ep_val *ep = bpf_map_lookup_elem(&lace_endpoints, &ek);
	if (!ep)
		return drop(DROP_NO_ENDPOINT);

	if (bpf_skb_adjust_room(skb, -(int)sizeof(struct ipv6hdr), BPF_ADJ_ROOM_MAC, flags))
		return drop(DROP_ADJUST);
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &inner_proto, 2, 0) ||
	    set_macs(skb, ep->pod_mac, ep->host_mac))
		return drop(DROP_ADJUST);
	count(FWD_DECAP);
	return bpf_redirect_peer(ep->ifindex, 0);
}

char __license[] SEC("license") = "GPL";
