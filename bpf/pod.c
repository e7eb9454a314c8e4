//go:build ignore

/* Programs on the host side of each pod's veth.
 *
 * from_pod (tc ingress): everything a pod sends. Anti-spoofing, then
 * connection tracking and the pod network's view (docs/topology.md,
 * views): a packet of a flow the pod's side did not open is a reply and goes
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
 * is_reply_to_host). to_pod, on the veth's egress, sees only what the
 * node's stack sends the pod, and translates just the answers of a
 * service endpoint at the node's own address. */
#include "lace.h"
#include "icmp.h"
#include "ct.h"
#include "fwd.h"
#include "lb.h"

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
 * quoted destination, and the error goes back to its source.
 *
 * Anything else is refused (-1): a quote of another pod's flow, of a flow
 * that never was, or an error sent elsewhere than the quoted source, would
 * carry what the pod chose to whoever the flow's peer network reaches (a
 * channel out of an isolated network, or into another network). So is an
 * error about a flow that came through an external frontend: it would
 * leave from the pod's own address, which its client never addressed. */
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
	if (!eq16(k->laddr, p->saddr) || !eq16(k->raddr, p->daddr))
		return -1;
	if (k->proto == IPPROTO_TCP || k->proto == IPPROTO_UDP) {
		k->lport = ports[1];
		k->rport = ports[0];
	} else {
		k->lport = ports[2]; /* an echo's identifier */
		k->rport = ports[2];
	}
	struct ct_val *ct = ct_lookup(k);
	if (!ct || (ct->flags & CT_REV_NAT))
		return -1;
	return 0;
}

/* route_in routes a reply of a flow the other side opened in that side's
 * network ctx_net, in its own view (where its subnets always win), with
 * this pod's network as the SID's source. An outside address there is the
 * reply to an outside source, sent as it is. */
static __noinline int route_in(struct __sk_buff *skb, struct pkt *p, __u32 net_id, __u32 ctx_net)
{
	struct route_val *rv = view_lookup(ctx_net, p);
	if (!rv || (rv->flags & (ROUTE_SUBNET | ROUTE_DENY | ROUTE_SERVICE)) ||
	    (!(rv->flags & ROUTE_EXTERNAL) && rv->dst_net != ctx_net))
		return drop(DROP_ISOLATED);
	__u32 flags = rv->flags;
	__u8 sid[16];
	__builtin_memcpy(sid, rv->sid, 16);
	if (flags & ROUTE_LOCAL)
		return deliver_answer(skb, p, ctx_net, net_id, FWD_LOCAL);
	if (dec_ttl(skb, p))
		return drop(DROP_ADJUST);
	if (flags & ROUTE_EXTERNAL)
		return send_fib(skb, p->family, p->saddr, p->daddr, FWD_REPLY_OUT);
	sid[SID_SRC_NET_BYTE] = net_id >> 8;
	sid[SID_SRC_NET_BYTE + 1] = net_id;
	return encap_and_send(skb, p, sid, 1);
}

/* to_service translates a packet to a service VIP (k is its conntrack key
 * as sent) to one of the service's endpoints, in place (p follows), and
 * records both sides of it: the client's tuple to the VIP keeps its
 * endpoint for the flow's life, and the translated flow keeps the VIP for
 * the replies. *svc_net is, in, the network of the view's route to the
 * VIP (lb_admit's route_net) and, out, the service's network. Returns 0
 * when translated; a drop verdict or RET_PORT_UNREACH otherwise. */
static __noinline int to_service(struct __sk_buff *skb, struct pkt *p, struct ct_key *k, __u32 *svc_net, int sock_lb)
{
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return drop(DROP_NO_SERVICE_PORT);
	struct svc_key sk = {.family = p->family, .proto = p->proto, .port = p->dport};
	__builtin_memcpy(sk.vip, p->daddr, 16);
	struct svc_val *sv = bpf_map_lookup_elem(&lace_services, &sk);
	if (!sv) {
		drop(DROP_NO_SERVICE_PORT);
		return RET_PORT_UNREACH;
	}
	/* A ClusterIP was admitted by the view lookup that brought the packet
	 * here; an external frontend reached from a pod is admitted as its
	 * ClusterIP would be. */
	int why = lb_admit(&sv, k->net_id, p->family, p->proto, p->daddr, p->saddr, LB_IN_CLUSTER | LB_VIEW_CHECKED, *svc_net);
	if (why)
		return drop(why);
	__u32 net = sv->net_id;
	why = lb_no_endpoint(sv);
	if (why == DROP_NO_BACKEND) {
		drop(why);
		return RET_PORT_UNREACH;
	}
	if (why)
		return drop(why);
	*svc_net = net;
	__u8 be_addr[16];
	__u16 be_port;
	/* The pod's own address is the endpoint's only in the service's own
	 * network: in another (overlapping) one it is somebody else. */
	int own_net = net == k->net_id;
	struct ct_val *ct = ct_lookup(k);
	if (ct && (ct->flags & CT_SERVICE) && !(is_tcp_syn(p) && ct_closing(ct))) {
		__builtin_memcpy(be_addr, ct->nat_addr, 16);
		be_port = ct->nat_port;
		ct_refresh(ct, p, 1);
	} else {
		ct = NULL;
		/* ClientIP affinity: the client's endpoint while it lasts (the
		 * agent forgets entries of endpoints that leave). A pod whose
		 * TCP sockets pass the socket hooks had its 1/n chance at
		 * itself there (translated to its own address, the flow never
		 * leaves it): drawn here, it is drawn again among the others.
		 * Only itself: hairpin below. */
		struct affinity_key ak;
		struct affinity_val av;
		int mode = sock_lb && own_net && p->proto == IPPROTO_TCP ? LB_NOT_SELF : LB_ANY;
		if (lb_pick(sv, p->family, p->saddr, p->saddr, mode, lb_flow_hash(p), &ak, &av, be_addr, &be_port))
			return drop(DROP_NO_BACKEND);
		struct ct_val v = {.peer_net = net, .flags = CT_ORIGIN_LOCAL | CT_SERVICE, .nat_port = be_port};
		__builtin_memcpy(v.nat_addr, be_addr, 16);
		ct_refresh(&v, p, 1);
		ct_insert(k, &v);
		count(FWD_SERVICE);
	}
	__u8 vip[16];
	__builtin_memcpy(vip, p->daddr, 16);
	__u16 vport = p->dport;
	if (nat_rewrite(skb, p, 0, be_addr, be_port))
		return drop(DROP_ADJUST);
	__builtin_memcpy(p->daddr, be_addr, 16);
	p->dport = be_port;

	/* Hairpin: a pod reaching itself through its service. Its answers to
	 * its own address would never leave it (local delivery), so the
	 * packet comes to it from the VIP, and from_pod turns the answers
	 * back (CT_HAIRPIN). */
	if (own_net && eq16(p->saddr, be_addr)) {
		if (nat_rewrite(skb, p, 1, vip, p->sport))
			return drop(DROP_ADJUST);
		__builtin_memcpy(p->saddr, vip, 16);
		struct ct_key hk;
		ct_key_of(&hk, k->net_id, p, 0);
		struct ct_val hv = {.peer_net = net, .flags = CT_HAIRPIN, .nat_port = vport};
		__builtin_memcpy(hv.nat_addr, vip, 16);
		ct_refresh(&hv, p, 1);
		bpf_map_update_elem(&lace_ct, &hk, &hv, BPF_ANY);
		return 0;
	}

	/* The translated flow, for the replies (and the endpoint's side); k
	 * becomes its key, which SNAT to an outside endpoint extends. */
	ct_key_of(k, k->net_id, p, 1);
	struct ct_val *fl = ct_lookup(k);
	if (fl && (fl->flags & CT_DNAT) && !(is_tcp_syn(p) && ct_closing(fl))) {
		ct_refresh(fl, p, 1);
		/* Answers refresh the translated flow only (that is what they
		 * carry): the client's entry takes its state, so an idle but
		 * answered connection keeps its endpoint as long as the flow
		 * lives, not only the 60 s of an unanswered SYN. */
		if (ct && (fl->flags & CT_SEEN_REPLY)) {
			ct->flags |= CT_SEEN_REPLY;
			ct->expires = fl->expires;
		}
	} else {
		struct ct_val v = {.peer_net = net, .flags = CT_ORIGIN_LOCAL | CT_DNAT, .nat_port = vport};
		__builtin_memcpy(v.nat_addr, vip, 16);
		ct_refresh(&v, p, 1);
		ct_insert(k, &v);
	}
	return 0;
}

/* is_frontend tells whether p is addressed to an external frontend (out
 * of line: from_pod's frame is the deepest chain's first). */
static __noinline int is_frontend(struct pkt *p)
{
	return frontend(p->family, p->proto, p->dport, p->daddr) != NULL;
}

/* rev_nat makes a pod's answer to an outside client of an external
 * frontend leave from the frontend the client addressed. */
static __noinline int rev_nat(struct __sk_buff *skb, struct pkt *p, struct ct_val *ct)
{
	__u8 fa[16];
	__builtin_memcpy(fa, ct->nat_addr, 16);
	__u16 fp = ct->nat_port;
	/* The answer moves the client's entry on too (xlb_in: keyed from
	 * the frontend in the client's external network): its reset closes
	 * it, so a blind handshake from a spoofed source that the pod
	 * refuses never leaves an established entry behind. */
	struct ct_key ck = {.net_id = ct->peer_net, .family = p->family, .proto = p->proto, .lport = fp, .rport = p->dport};
	__builtin_memcpy(ck.laddr, fa, 16);
	__builtin_memcpy(ck.raddr, p->daddr, 16);
	struct ct_val *cl = ct_lookup(&ck);
	if (cl && (cl->flags & (CT_SERVICE | CT_SNAT)) == CT_SERVICE) {
		cl = ct_update(&ck, cl, p, 0);
		if (cl && (p->tcp_flags & TCP_RST))
			cl->flags |= CT_RST_LOCAL; /* the pod's own: final */
	}
	if (nat_rewrite(skb, p, 1, fa, fp))
		return -1;
	__builtin_memcpy(p->saddr, fa, 16);
	p->sport = fp;
	return 0;
}

/* too_big_back sends the ICMP error a forwarding function asked for. */
static __always_inline int too_big_back(struct __sk_buff *skb, struct pkt *p, int rc)
{
	if (rc == RET_TOO_BIG)
		return icmp_error(skb, p, ICMP_KIND_TOO_BIG, p->mtu, DROP_MTU);
	/* to_service counted why (no-service-port or no-endpoints). */
	if (rc == RET_PORT_UNREACH)
		return icmp_error(skb, p, ICMP_KIND_PORT_UNREACH, 0, DROP_MAX);
	return rc;
}

/* hairpin_back turns an endpoint's answer on its own flow through its
 * service (to the VIP, from its endpoint port) into the answer its client
 * side expects (from the VIP and service port, to itself), and delivers
 * it. */
static __noinline int hairpin_back(struct __sk_buff *skb, struct pkt *p, __u32 net_id, struct ct_val *ct)
{
	__u8 vip[16], self[16];
	__builtin_memcpy(vip, ct->nat_addr, 16);
	__builtin_memcpy(self, p->saddr, 16);
	__u16 vport = ct->nat_port;
	ct_refresh(ct, p, 0);
	if (nat_rewrite(skb, p, 0, self, p->dport))
		return drop(DROP_ADJUST);
	__builtin_memcpy(p->daddr, self, 16);
	if (nat_rewrite(skb, p, 1, vip, vport))
		return drop(DROP_ADJUST);
	__builtin_memcpy(p->saddr, vip, 16);
	p->sport = vport;
	return deliver_answer(skb, p, net_id, net_id, FWD_LOCAL);
}

static __always_inline int from_pod_run(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ingress_ifindex;
	struct port_val *port = bpf_map_lookup_elem(&lace_ports, &ifindex);
	if (!port)
		return drop(DROP_UNKNOWN_PORT);
	__u32 net_id = port->net_id;
	int sock_lb = port->flags & PORT_SOCK_LB;
	/* A tagged frame (the kernel moved the pod's 802.1Q tag out of the
	 * frame before tc): redirected, it would keep the tag and leave the
	 * underlay in the VLAN the pod chose. */
	if (skb->vlan_present)
		return drop(DROP_NOT_IP);

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

	/* A later fragment is its datagram's first as the pod sent it in its
	 * network (frag.h): the same view, flow and translation. */
	if (frag_track(&p, net_id, 0))
		return drop(DROP_FRAG_NO_FIRST);

	/* An external frontend (a NodePort of this node, a LoadBalancer or
	 * external IP) is a service to a pod, whatever else its address is. */
	int front = is_frontend(&p);
	struct ct_key k;

	/* The node's own addresses: answers to its connections (probes) go
	 * to it; a pod opens one only where its view holds the address (the
	 * node is an outside host like any other, classified by address).
	 * Pod addresses are unique per node, so the node tells pods apart. */
	struct host_key hk = {.family = p.family};
	__builtin_memcpy(hk.addr, p.daddr, 16);
	if (!front && bpf_map_lookup_elem(&lace_host_addrs, &hk)) {
		/* A pod's answer to itself through a NodePort of this node
		 * (hairpin): its request came from the frontend. */
		if (p.proto == IPPROTO_TCP || p.proto == IPPROTO_UDP) {
			ct_key_of(&k, net_id, &p, 1);
			struct ct_val *hp = ct_lookup(&k);
			if (hp && (hp->flags & CT_HAIRPIN))
				return hairpin_back(skb, &p, net_id, hp);
		}
		if (!is_reply_to_host(&p)) {
			struct route_val *hv = view_lookup(net_id, &p);
			if (!hv || !(hv->flags & ROUTE_EXTERNAL))
				return drop(DROP_HOST);
			if (pol_denied(ifindex, POL_OUT, hv->dst_net, &p))
				return drop(DROP_POLICY);
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
	if (icmp_err) {
		if (quoted_key(skb, &p, net_id, &k))
			return drop(DROP_ICMP_NOT_OURS);
	} else {
		ct_key_of(&k, net_id, &p, 1);
	}
	struct ct_val *ct = ct_lookup(&k);
	if (ct && (ct->flags & CT_HAIRPIN) && !icmp_err)
		return hairpin_back(skb, &p, net_id, ct);
	if (ct && !(ct->flags & CT_ORIGIN_LOCAL) && !(is_tcp_syn(&p) && ct_closing(ct))) {
		if (!icmp_err) {
			ct_refresh(ct, &p, 0);
			/* The pod's reset is its own (nobody forged it): final. */
			if (p.proto == IPPROTO_TCP && (p.tcp_flags & TCP_RST))
				ct->flags |= CT_RST_LOCAL;
			/* An answer to an outside client of an external
			 * frontend leaves from the frontend it addressed. */
			if ((ct->flags & CT_REV_NAT) && rev_nat(skb, &p, ct))
				return drop(DROP_ADJUST);
		}
		return too_big_back(skb, &p, route_in(skb, &p, net_id, ct->peer_net));
	}

	/* A new flow, or more of one this pod opened: the view decides. */
	__u8 sid[16];
	struct route_val *rv = view_lookup(net_id, &p);
	if (!rv || (rv->flags & ROUTE_DENY))
		return drop(DROP_ISOLATED);
	/* A frontend is reached through the outside its address lies in. */
	if (front && (rv->flags & (ROUTE_EXTERNAL | ROUTE_SERVICE)) != ROUTE_EXTERNAL)
		return drop(DROP_ISOLATED);
	if ((rv->flags & ROUTE_SERVICE) || front) {
		/* A service the view reaches: its endpoint is reached in the
		 * service's network, whatever the view holds of it. */
		if (icmp_err)
			return drop(DROP_ISOLATED);
		__u32 svc_net = rv->dst_net;
		int rc = to_service(skb, &p, &k, &svc_net, sock_lb);
		if (rc)
			return too_big_back(skb, &p, rc);
		/* Routed here, not in a function: the SNAT to an outside
		 * endpoint (the kubernetes Service's API server) would be one
		 * call too deep for the stack. */
		struct route_val *sr = view_lookup(svc_net, &p);
		if (!sr || (sr->flags & (ROUTE_DENY | ROUTE_SERVICE | ROUTE_SUBNET)) ||
		    (!(sr->flags & ROUTE_EXTERNAL) && sr->dst_net != svc_net))
			return drop(sr && (sr->flags & ROUTE_SUBNET) ? DROP_NO_ENDPOINT : DROP_ISOLATED);
		__u32 sflags = sr->flags, sdst = sr->dst_net;
		__builtin_memcpy(sid, sr->sid, 16);
		/* Decided on the endpoint the service chose, as upstream's
		 * policies are. */
		if (pol_denied(ifindex, POL_OUT, (sflags & ROUTE_EXTERNAL) ? sdst : svc_net, &p))
			return drop(DROP_POLICY);
		if (!ct)
			flow_tell(&p, flow_nets(net_id, (sflags & ROUTE_EXTERNAL) ? sdst : svc_net), ifindex,
				  FLOW_FORWARDED | FLOW_SVC | (POL_OUT << 16));
		if (sflags & ROUTE_LOCAL)
			return deliver_local(skb, &p, svc_net, net_id, FWD_LOCAL);
		if (sflags & ROUTE_EXTERNAL) {
			/* An endpoint at this node's own address (a hostNetwork
			 * pod): handed to the node's stack with the pod's address,
			 * like any pod flow to its node; to_pod restores the VIP
			 * on the stack's answers. */
			__builtin_memcpy(hk.addr, p.daddr, 16);
			if (bpf_map_lookup_elem(&lace_host_addrs, &hk)) {
				count(FWD_HOST);
				return TC_ACT_OK;
			}
			return snat_out(skb, &p, &k, sdst);
		}
		sid[SID_SRC_NET_BYTE] = net_id >> 8;
		sid[SID_SRC_NET_BYTE + 1] = net_id;
		if (dec_ttl(skb, &p))
			return drop(DROP_ADJUST);
		return too_big_back(skb, &p, encap_and_send(skb, &p, sid, 1));
	}
	if (rv->flags & ROUTE_CLOSED)
		return drop(DROP_ANONYMOUS);
	if (rv->flags & ROUTE_SUBNET)
		return drop(DROP_NO_ENDPOINT);
	__u32 flags = rv->flags, dst_net = rv->dst_net;
	__builtin_memcpy(sid, rv->sid, 16);
	if (!icmp_err && pol_denied(ifindex, POL_OUT, dst_net, &p))
		return drop(DROP_POLICY);
	if (flags & ROUTE_EXTERNAL) {
		if (icmp_err)
			return drop(DROP_ISOLATED); /* about no flow of ours */
		if (!ct)
			flow_tell(&p, flow_nets(net_id, dst_net), ifindex, FLOW_FORWARDED | (POL_OUT << 16));
		return snat_out(skb, &p, &k, dst_net);
	}
	if (!icmp_err) {
		if (ct && !(is_tcp_syn(&p) && ct_closing(ct))) {
			ct_refresh(ct, &p, 1);
		} else {
			ct_create(&k, dst_net, CT_ORIGIN_LOCAL, 0, &p, 1);
			flow_tell(&p, flow_nets(net_id, dst_net), ifindex, FLOW_FORWARDED | (POL_OUT << 16));
		}
	}
	if (flags & ROUTE_LOCAL)
		return deliver_local(skb, &p, dst_net, net_id, FWD_LOCAL);
	if (dec_ttl(skb, &p))
		return drop(DROP_ADJUST);
	return too_big_back(skb, &p, encap_and_send(skb, &p, sid, 1));
}

/* Each program tells the drop it noted as it ends (flows.h). */
SEC("tc")
int from_pod(struct __sk_buff *skb)
{
	return flow_drop_tell(skb, from_pod_run(skb), FLOW_AT_POD_OUT);
}

/* to_pod (tc egress) sees only what the node's own stack sends to the
 * pod: everything else reaches it by bpf_redirect_peer, which skips this
 * hook. Among that, the answers of a service endpoint at the node's own
 * address (a hostNetwork pod) to a flow this pod sent to the VIP: they
 * leave here from the VIP and service port the pod addressed. Probes and
 * answers to the pod's own connections to the node pass untouched. */
static __always_inline int to_pod_run(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	struct port_val *port = bpf_map_lookup_elem(&lace_ports, &ifindex);
	if (!port)
		return TC_ACT_OK;
	__u32 net_id = port->net_id;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return TC_ACT_OK;
	struct pkt p = {};
	if (parse_ip(skb, eth->h_proto, ETH_HLEN, &p))
		return TC_ACT_OK;
	if (p.proto != IPPROTO_TCP && p.proto != IPPROTO_UDP)
		return TC_ACT_OK;
	/* The node's stack sends its fragments in order; one without its
	 * first is left as it is (the pod's reassembly drops it). */
	if (frag_track(&p, NODE_NET_ID, net_id))
		return TC_ACT_OK;
	struct ct_key k;
	ct_key_of(&k, net_id, &p, 0);
	struct ct_val *ct = ct_lookup(&k);
	if (!ct || (ct->flags & (CT_DNAT | CT_ORIGIN_LOCAL)) != (CT_DNAT | CT_ORIGIN_LOCAL))
		return TC_ACT_OK;
	ct = ct_update(&k, ct, &p, 0);
	if (unnat_reply(skb, &p, ct))
		return drop(DROP_ADJUST);
	return TC_ACT_OK;
}

SEC("tc")
int to_pod(struct __sk_buff *skb)
{
	return flow_drop_tell(skb, to_pod_run(skb), FLOW_AT_POD_IN);
}

char __license[] SEC("license") = "GPL";
