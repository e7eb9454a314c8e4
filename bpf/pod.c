//go:build ignore

/* Programs on the host side of each pod's veth.
 *
 * from_pod (tcx ingress): everything a pod sends. Anti-spoofing, then
 * connection tracking and the pod network's view (ARCHITECTURE.md section
 * 5): a packet of a flow the pod's side did not open is a reply and goes
 * back in the context of the network that opened it; anything else is a
 * new flow (or more of one the pod opened) and its destination is looked
 * up by longest prefix in the view of the pod's network, which holds only
 * what policies grant. Then delivery to a pod on this node with
 * bpf_redirect_peer, SRv6 encapsulation (reduced: the SID in the outer
 * destination, carrying the source and destination networks) toward the
 * node owning the destination's block, or SNAT out of the underlay to an
 * external network.
 *
 * The node itself reaches its pods (kubelet probes), the one exception to
 * isolation; pods may answer it, and open connections to it only when
 * their view holds its address. That rule is stateless (see
 * is_reply_to_host), so it needs no program on the veth's egress:
 * attaching a tcx program costs an RCU grace period, and one per pod
 * halves the time a pod waits for its network. */
#include "lace.h"
#include "icmp.h"
#include "ct.h"
#include "fwd.h"

/* is_reply_to_host accepts what a pod may send to its node unasked: TCP
 * segments that do not open a connection (no SYN without ACK: the node's
 * stack resets anything that matches no socket of its own), ICMP echo
 * replies and ICMP errors. */
static __always_inline int is_reply_to_host(struct pkt *p)
{
	if (p->proto == IPPROTO_TCP)
		return !is_tcp_syn(p);
	if (p->proto == IPPROTO_ICMP)
		return p->icmp_type == 0 || p->icmp_type == 3 || p->icmp_type == 11;
	if (p->proto == IPPROTO_ICMPV6)
		return p->icmp_type == 129 || p->icmp_type < 128;
	return 0;
}

/* quoted_key builds the conntrack key of the flow an ICMP error from a pod
 * is about: the error quotes a packet the pod received, so the pod is the
 * quoted destination. */
static __noinline int quoted_key(struct __sk_buff *skb, struct pkt *p, __u32 net_id, struct ct_key *k)
{
	__u32 off = p->l4_off + 8;
	k->net_id = net_id;
	k->family = p->family;
	k->pad = 0;
	__u32 l4;
	if (p->family == LACE_FAMILY_V4) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)))
			return -1;
		k->proto = ip.protocol;
		__builtin_memset(k->laddr, 0, 16);
		__builtin_memset(k->raddr, 0, 16);
		__builtin_memcpy(k->laddr, &ip.daddr, 4);
		__builtin_memcpy(k->raddr, &ip.saddr, 4);
		l4 = off + ip.ihl * 4;
	} else {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)))
			return -1;
		k->proto = ip6.nexthdr;
		__builtin_memcpy(k->laddr, &ip6.daddr, 16);
		__builtin_memcpy(k->raddr, &ip6.saddr, 16);
		l4 = off + sizeof(ip6);
	}
	__u16 ports[3];
	if (bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)))
		return -1;
	if (k->proto == IPPROTO_TCP || k->proto == IPPROTO_UDP) {
		k->lport = ports[1];
		k->rport = ports[0];
	} else {
		k->lport = ports[2]; /* an echo's identifier */
		k->rport = ports[2];
	}
	return 0;
}

/* reply routes a packet of a flow the other side opened back in that
 * side's network: its own entries in its own view (where its subnets
 * always win), with this pod's network as the SID's source. */
static __noinline int reply(struct __sk_buff *skb, struct pkt *p, __u32 net_id, __u32 peer_net)
{
	struct route_val *rv = view_lookup(peer_net, p);
	if (!rv || rv->dst_net != peer_net || (rv->flags & (ROUTE_SUBNET | ROUTE_DENY)))
		return drop(DROP_ISOLATED);
	__u32 flags = rv->flags;
	__u8 sid[16];
	__builtin_memcpy(sid, rv->sid, 16);
	if (flags & ROUTE_LOCAL)
		return deliver_local(skb, p, peer_net, net_id, FWD_LOCAL);
	if (dec_ttl(skb, p))
		return drop(DROP_ADJUST);
	if (flags & ROUTE_EXTERNAL)
		return send_fib(skb, p->family, p->saddr, p->daddr, FWD_REPLY_OUT);
	sid[SID_SRC_NET_BYTE] = net_id >> 8;
	sid[SID_SRC_NET_BYTE + 1] = net_id;
	return encap_and_send(skb, p, sid, 1);
}

/* too_big_back sends the ICMP error a forwarding function asked for. */
static __always_inline int too_big_back(struct __sk_buff *skb, struct pkt *p, int rc)
{
	if (rc == RET_TOO_BIG)
		return icmp_error(skb, p, ICMP_KIND_TOO_BIG, p->mtu, DROP_MTU);
	return rc;
}

SEC("tcx/ingress")
int from_pod(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ingress_ifindex;
	struct port_val *port = bpf_map_lookup_elem(&lace_ports, &ifindex);
	if (!port)
		return drop(DROP_UNKNOWN_PORT);
	__u32 net_id = port->net_id;

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
		if (p.proto == IPPROTO_ICMPV6 && p.icmp_type >= 133 && p.icmp_type <= 137)
			return drop(DROP_NOT_IP);
		if (!(port->flags & PORT_HAS_V6) || !eq16(p.saddr, port->ip6))
			return drop(DROP_SPOOF);
	}

	/* The node's own addresses: answers to its connections (probes) go
	 * to it; a pod opens one only where its view holds the address (the
	 * node is an outside host like any other, classified by address).
	 * Pod addresses are unique per node, so the node tells pods apart. */
	struct host_key hk = {.family = p.family};
	__builtin_memcpy(hk.addr, p.daddr, 16);
	if (bpf_map_lookup_elem(&lace_host_addrs, &hk)) {
		if (!is_reply_to_host(&p)) {
			struct route_val *hv = view_lookup(net_id, &p);
			if (!hv || !(hv->flags & ROUTE_EXTERNAL))
				return drop(DROP_HOST);
		}
		count(FWD_HOST);
		return TC_ACT_OK;
	}

	/* This node is a routed hop: an expiring packet earns time exceeded
	 * from it, so traceroute shows it. */
	int icmp_err = is_icmp_error(&p);
	if (p.ttl <= 1) {
		if (icmp_err)
			return drop(DROP_TTL);
		return icmp_error(skb, &p, ICMP_KIND_TIME_EXCEEDED, 0, DROP_TTL);
	}

	/* Conntrack: a packet of a flow the other side opened is a reply.
	 * An ICMP error belongs to the flow it quotes. A bare SYN on a
	 * closing flow opens a new one. */
	struct ct_key k;
	if (icmp_err) {
		if (quoted_key(skb, &p, net_id, &k))
			return drop(DROP_ISOLATED);
	} else {
		ct_key_of(&k, net_id, &p, 1);
	}
	struct ct_val *ct = ct_lookup(&k);
	if (ct && !(ct->flags & CT_ORIGIN_LOCAL) && !(is_tcp_syn(&p) && ct_closing(ct))) {
		if (!icmp_err)
			ct_refresh(ct, &p, 0);
		return too_big_back(skb, &p, reply(skb, &p, net_id, ct->peer_net));
	}

	/* A new flow, or more of one this pod opened: the view decides. */
	struct route_val *rv = view_lookup(net_id, &p);
	if (!rv || (rv->flags & ROUTE_DENY))
		return drop(DROP_ISOLATED);
	if (rv->flags & ROUTE_CLOSED)
		return drop(DROP_ANONYMOUS);
	if (rv->flags & ROUTE_SUBNET)
		return drop(DROP_NO_ENDPOINT);
	__u32 flags = rv->flags, dst_net = rv->dst_net;
	__u8 sid[16];
	__builtin_memcpy(sid, rv->sid, 16);
	if (flags & ROUTE_EXTERNAL) {
		if (icmp_err)
			return drop(DROP_ISOLATED); /* about no flow of ours */
		return snat_out(skb, &p, &k, dst_net);
	}
	if (!icmp_err) {
		if (ct && !(is_tcp_syn(&p) && ct_closing(ct)))
			ct_refresh(ct, &p, 1);
		else
			ct_create(&k, dst_net, CT_ORIGIN_LOCAL, 0, &p, 1);
	}
	if (flags & ROUTE_LOCAL)
		return deliver_local(skb, &p, dst_net, net_id, FWD_LOCAL);
	if (dec_ttl(skb, &p))
		return drop(DROP_ADJUST);
	return too_big_back(skb, &p, encap_and_send(skb, &p, sid, 1));
}

char __license[] SEC("license") = "GPL";
