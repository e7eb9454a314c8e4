//go:build ignore

/* Programs on the host side of each pod's veth.
 *
 * from_pod (tcx ingress): everything a pod sends. Anti-spoofing, isolation
 * by default (a destination is looked up only in the pod's own network),
 * then delivery to a pod on this node with bpf_redirect_peer, or SRv6
 * encapsulation (reduced: the SID in the outer destination, no routing
 * header) toward the node owning the destination's block.
 *
 * The node itself reaches its pods (kubelet probes), the one exception to
 * isolation; pods may answer it but never open anything towards it. That
 * rule is stateless (see is_reply_to_host), so it needs no program on the
 * veth's egress: attaching a tcx program costs an RCU grace period, and
 * one per pod halves the time a pod waits for its network. */
#include "lace.h"
#include "icmp.h"

/* l4_header_len is the length of a TCP or UDP header at p->l4_off, or 0. */
static __always_inline __u32 l4_header_len(struct __sk_buff *skb, struct pkt *p)
{
	if (p->proto == IPPROTO_UDP)
		return sizeof(struct udphdr);
	if (p->proto != IPPROTO_TCP)
		return 0;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct tcphdr *th = data + p->l4_off;
	if ((void *)(th + 1) > end)
		return sizeof(struct tcphdr);
	return th->doff * 4;
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
 * never earns another (RFC 1122, RFC 4443). */
static __always_inline int is_icmp_error(struct __sk_buff *skb, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u8 *type = data + p->l4_off;
	if ((void *)(type + 1) > end)
		return 0;
	if (p->proto == IPPROTO_ICMP)
		return *type == ICMP_DEST_UNREACH || *type == ICMP_TIME_EXCEEDED || *type == ICMP_PARAMETERPROB;
	if (p->proto == IPPROTO_ICMPV6)
		return *type < 128;
	return 0;
}

static __always_inline int encap_and_send(struct __sk_buff *skb, struct pkt *p, const __u8 *sid)
{
	struct lace_config *cfg = config();
	if (!cfg)
		return drop(DROP_FIB);
	__u32 mtu = 0;
	if (too_big(skb, p, cfg->underlay_ifindex, &mtu)) {
		if (is_icmp_error(skb, p))
			return drop(DROP_MTU);
		return icmp_error(skb, p, ICMP_KIND_TOO_BIG, mtu, DROP_MTU);
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

	struct bpf_fib_lookup fib = {};
	fib.family = AF_INET6;
	fib.ifindex = cfg->underlay_ifindex;
	/* tot_len stays 0: the kernel then checks the MTU against the skb
	 * itself, which understands GSO; a tot_len of a 64 KB GSO packet would
	 * answer FRAG_NEEDED. */
	__builtin_memcpy(fib.ipv6_src, cfg->underlay_ip6, 16);
	__builtin_memcpy(fib.ipv6_dst, sid, 16);
	long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		if (set_macs(skb, fib.dmac, fib.smac))
			return drop(DROP_ADJUST);
		count(FWD_ENCAP);
		return bpf_redirect(fib.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		/* The kernel resolves the neighbour and queues the packet. */
		count(FWD_ENCAP);
		return bpf_redirect_neigh(fib.ifindex, 0, 0, 0);
	}
	return drop(DROP_FIB);
}

/* is_reply_to_host accepts what a pod may send to its node: TCP segments
 * that do not open a connection (no SYN without ACK: the node's stack
 * resets anything that matches no socket of its own), ICMP echo replies
 * and ICMP errors. UDP and new TCP connections are refused. */
static __always_inline int is_reply_to_host(struct __sk_buff *skb, struct pkt *p, __u32 l4_off)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (p->proto == IPPROTO_TCP) {
		struct tcphdr *th = data + l4_off;
		if ((void *)(th + 1) > end)
			return 0;
		return !(th->syn && !th->ack);
	}
	if (p->proto == IPPROTO_ICMP) {
		__u8 *type = data + l4_off;
		if ((void *)(type + 1) > end)
			return 0;
		return *type == 0 || *type == 3 || *type == 11; /* echo reply, unreachable, time exceeded */
	}
	if (p->proto == IPPROTO_ICMPV6) {
		__u8 *type = data + l4_off;
		if ((void *)(type + 1) > end)
			return 0;
		return *type == 129 || *type < 128; /* echo reply, errors */
	}
	return 0;
}

SEC("tcx/ingress")
int from_pod(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ingress_ifindex;
	struct port_val *port = bpf_map_lookup_elem(&lace_ports, &ifindex);
	if (!port)
		return drop(DROP_UNKNOWN_PORT);

	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return drop(DROP_NOT_IP);

	struct pkt p = {};
	if (parse_ip(skb, eth->h_proto, ETH_HLEN, &p))
		return drop(DROP_NOT_IP);

	/* Anti-spoofing: a pod sends only from its own addresses. Neighbour
	 * discovery never leaves the pod: its gateway is a permanent entry. */
	if (p.family == LACE_FAMILY_V4) {
		if (!(port->flags & PORT_HAS_V4) || !eq4(p.saddr, port->ip4))
			return drop(DROP_SPOOF);
	} else {
		/* Link-local and unspecified sources (MLD, DAD, router
		 * solicitations) never leave the pod's link. */
		if ((p.saddr[0] == 0xfe && (p.saddr[1] & 0xc0) == 0x80) ||
		    (((__u32 *)p.saddr)[0] == 0 && ((__u32 *)p.saddr)[1] == 0 &&
		     ((__u32 *)p.saddr)[2] == 0 && ((__u32 *)p.saddr)[3] == 0))
			return drop(DROP_NOT_IP);
		if (p.proto == IPPROTO_ICMPV6) {
			struct icmp6hdr *icmp = data + ETH_HLEN + sizeof(struct ipv6hdr);
			if ((void *)(icmp + 1) > (void *)(long)skb->data_end)
				return drop(DROP_NOT_IP);
			if (icmp->icmp6_type >= 133 && icmp->icmp6_type <= 137)
				return drop(DROP_NOT_IP);
		}
		if (!(port->flags & PORT_HAS_V6) || !eq16(p.saddr, port->ip6))
			return drop(DROP_SPOOF);
	}

	/* Answers to the node's own connections (probes) go to the node. */
	struct host_key hk = {.family = p.family};
	__builtin_memcpy(hk.addr, p.daddr, 16);
	if (bpf_map_lookup_elem(&lace_host_addrs, &hk)) {
		if (!is_reply_to_host(skb, &p, p.l4_off))
			return drop(DROP_HOST);
		count(FWD_HOST);
		return TC_ACT_OK;
	}

	/* This node is a routed hop: an expiring packet earns time exceeded
	 * from it, so traceroute shows it. */
	if (p.ttl <= 1) {
		if (is_icmp_error(skb, &p))
			return drop(DROP_TTL);
		return icmp_error(skb, &p, ICMP_KIND_TIME_EXCEEDED, 0, DROP_TTL);
	}

	/* Isolation by default: only the pod's own network is searched. */
	struct route_key rk = {.prefixlen = 64 + 128, .net_id = port->net_id, .family = p.family};
	__builtin_memcpy(rk.addr, p.daddr, 16);
	struct route_val *rv = bpf_map_lookup_elem(&lace_routes, &rk);
	if (!rv)
		return drop(DROP_ISOLATED);

	struct net_val *nv = bpf_map_lookup_elem(&lace_networks, &port->net_id);
	if (nv && (nv->flags & NET_ANONYMOUS)) {
		struct policy_key pk = {.src_net = port->net_id, .dst_net = port->net_id};
		if (!bpf_map_lookup_elem(&lace_policies, &pk))
			return drop(DROP_ANONYMOUS);
	}

	if (rv->flags & ROUTE_LOCAL) {
		struct ep_key ek = {.net_id = port->net_id, .family = p.family};
		__builtin_memcpy(ek.addr, p.daddr, 16);
		struct ep_val *ep = bpf_map_lookup_elem(&lace_endpoints, &ek);
		if (!ep)
			return drop(DROP_NO_ENDPOINT);
		if (dec_ttl(skb, &p) || set_macs(skb, ep->pod_mac, ep->host_mac))
			return drop(DROP_ADJUST);
		count(FWD_LOCAL);
		return bpf_redirect_peer(ep->ifindex, 0);
	}

	__u8 sid[16];
	__builtin_memcpy(sid, rv->sid, 16);
	if (dec_ttl(skb, &p))
		return drop(DROP_ADJUST);
	return encap_and_send(skb, &p, sid);
}

char __license[] SEC("license") = "GPL";
