//go:build ignore

/* from_underlay (tcx ingress of the node's underlay interface) decides what
 * may enter the node from the fabric:
 *
 * - SRv6 to a SID inside this node's locator, from a known node, naming
 *   known source and destination networks, with nothing between the outer
 *   header and the inner packet (no extension header, no fragment):
 *   decapsulated, recorded in conntrack with the source network the SID
 *   carries, and delivered to the pod by bpf_redirect_peer;
 * - ARP requests and neighbour solicitations for a LoadBalancer VIP this
 *   node announces: answered from here (announce.h); other ARP and ND are
 *   the host's;
 * - plain IP to an external frontend of a service (a NodePort of this
 *   node's address, a LoadBalancer or external IP): admitted as the
 *   service's ClusterIP would be for the source's external network, then
 *   translated to an endpoint (xlb_in);
 * - plain IP addressed to the node itself: a reply to a pod's SNAT flow is
 *   translated back and delivered to the pod; anything else (and link-local,
 *   multicast, broadcast, ARP and other non-IP frames) goes to the host
 *   stack;
 * - any other plain IP comes from outside the cluster
 *   (docs/external-networks.md): its source is classified into an
 *   external network by the longest external prefix (none: dropped,
 *   unclassified-source) and its destination looked up in that network's
 *   view: a pod is delivered here or encapsulated to its node with the
 *   source preserved; anything else is dropped (a node is not a router);
 * - IP in a unicast frame sent to another MAC (a switch flooded it) is
 *   neither decapsulated, translated nor forwarded: the kernel's when
 *   addressed to the node's underlay address or link-local, else dropped
 *   (other-host). ARP and ND for a VIP are answered whatever the MAC.
 *
 * Until the agent has written the node's own addresses it does not set
 * LACE_CFG_UNDERLAY_GUARD, and plain IP passes (no pod is attached before). */
#include "lace.h"
#include "fwd.h"
#include "lb.h"
#include "announce.h"
#include "icmp.h"
#include "l2.h"

/* decap's answer that the SID names the nodes' context (xlb_reply). */
#define RET_NODE_CTX 0x7002

/* host_addr tells whether addr (4 or 16 bytes) is one of this node's. */
static __always_inline int host_addr(__u8 family, const void *addr)
{
	struct host_key k = {.family = family};
	if (family == LACE_FAMILY_V4)
		__builtin_memcpy(k.addr, addr, 4);
	else
		__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&lace_host_addrs, &k) != NULL;
}

/* outside_spoofed tells whether a plain-IP source from the fabric claims
 * an address inside the cluster (lace_inside): a pod subnet, a service
 * range or a node's locator. Pods' traffic leaves a node encapsulated or
 * from the node's address (SNAT); only their replies to outside sources
 * and to other nodes' own sockets leave raw, and those go to an outside
 * address or to a node's own (to_host, which hands them to the host). */
static __always_inline int outside_spoofed(struct pkt *p)
{
	struct class_key ck = {.prefixlen = 32 + 128, .family = p->family};
	__builtin_memcpy(ck.addr, p->saddr, 16);
	return bpf_map_lookup_elem(&lace_inside, &ck) != NULL;
}

/* mark_ce sets ECN CE on the (decapsulated) IP header after Ethernet. */
static __always_inline int mark_ce(struct __sk_buff *skb, struct pkt *p)
{
	if (p->family == LACE_FAMILY_V4) {
		__u8 vihl;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &vihl, 1))
			return -1;
		__u8 tos = p->tos | 3;
		__u16 old = bpf_htons(((__u16)vihl << 8) | p->tos);
		__u16 new = bpf_htons(((__u16)vihl << 8) | tos);
		if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old, new, 2))
			return -1;
		return bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tos), &tos, 1, 0);
	}
	/* IPv6: ECN is the low two bits of the traffic class, bits 5-4 of the
	 * header's second byte. */
	__u8 b1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + 1, &b1, 1))
		return -1;
	b1 |= 0x30;
	return bpf_skb_store_bytes(skb, ETH_HLEN + 1, &b1, 1, 0);
}

/* decap_inner gives the inner protocol and the room adjustment flags of
 * an SRv6 packet carrying nexthdr, or -1 when that is neither IPv4 nor
 * IPv6. FIXED_GSO as at encapsulation: the segment size was kept then, so
 * it is kept now, and the kernel refuses to shrink a UDP GSO packet
 * without it (its gso_size delimits datagrams). */
static __always_inline int decap_inner(__u8 nexthdr, __u16 *proto, __u64 *flags)
{
	*flags = BPF_F_ADJ_ROOM_NO_CSUM_RESET | BPF_F_ADJ_ROOM_FIXED_GSO;
	if (nexthdr == IPPROTO_IPIP) {
		*proto = bpf_htons(ETH_P_IP);
		*flags |= LACE_ADJ_ROOM_DECAP_L3_IPV4;
		return 0;
	}
	if (nexthdr == IPPROTO_IPV6) {
		*proto = bpf_htons(ETH_P_IPV6);
		*flags |= LACE_ADJ_ROOM_DECAP_L3_IPV6;
		return 0;
	}
	return -1;
}

/* The large locals of xlb_in and xlb_reply, per CPU: on the stack they
 * would exceed the 512 bytes the verifier allows from_underlay's deepest
 * call chain (a tc program runs to its end on one CPU). */
struct xlb_scratch {
	struct ct_key k;  /* the client's flow, from the frontend's side */
	struct ct_key ek; /* the endpoint's side */
	struct ct_val v;
	struct xlb_rev_key rk;
	struct xlb_rev_val rv;
	struct affinity_key ak;
	struct affinity_val av;
	struct route_key rtk;
	struct snat_key fk; /* a destination without a free node port */
	struct ep_key epk; /* the endpoint, in lace_endpoints */
	__u8 be[16];
	__u8 front[16];
	__u8 node[16];
	__u8 sid[16];
	struct reset_ahead ra; /* the port's last flow may be half open at the endpoint */
	__u32 prev_isn;	       /* xlb_port: the mapping a port was taken from */
	__u32 prev_flags;
	/* The packet's sequence number, when it is a SYN with its own header
	 * (syn 1). Here, not in registers: a value live across xlb_port's loop
	 * splits every state the verifier walks there. */
	__u32 isn;
	__u32 syn;
	/* The node port the client's tuple had (network order), when its
	 * entry is still there (a SYN starting it over, or a mapping lost):
	 * xlb_port tries it first. */
	__u16 again;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xlb_scratch);
} lace_xlb_scratch SEC(".maps");

/* xlb_client_saw_synack tells whether the client's segment p acknowledges
 * exactly the endpoint's SYN-ACK recorded in rv: only the client the
 * SYN-ACK went to knows its sequence number; a blind one guesses it at
 * 2^-32 a try. Exactly: while the mapping is half open the endpoint has
 * sent nothing past its SYN-ACK (its data ends the state). */
static __always_inline int xlb_client_saw_synack(struct __sk_buff *skb, struct pkt *p, struct xlb_rev_val *rv)
{
	if (p->proto != IPPROTO_TCP || p->frag == PKT_FRAG_LATER || !(rv->flags & XLB_REV_EISN) ||
	    (p->tcp_flags & (TCP_SYN | TCP_RST | TCP_ACK)) != TCP_ACK)
		return 0;
	__u32 ack;
	if (bpf_skb_load_bytes(skb, p->l4_off + 8, &ack, 4))
		return 0;
	return bpf_ntohl(ack) == bpf_ntohl(rv->eisn) + 1;
}

/* xlb_port finds the node's port for a translated flow to endpoint
 * x->be:be_port and records how to turn its answers back. isn: a SYN's
 * sequence number.
 *
 * A port given up by a flow whose client sent only SYNs (a flood's, or a
 * handshake that lost its port) may still be half open at the endpoint:
 * its kernel keeps the connection request, retransmitting its SYN-ACK to
 * nobody, for up to a minute, while ports toward one endpoint come round
 * again within a second under a flood. A new SYN on that port then meets
 * the old request: the endpoint answers with a bare ACK for the old
 * sequence (or, rate-limited, not at all), and the new client's handshake
 * fails however often it retries. So xlb_port asks (x->ra) for a reset
 * of the old flow, sent to the endpoint just ahead of the new SYN on the
 * same path: the old request is gone when the SYN arrives. */
static __always_inline int xlb_port(struct __sk_buff *skb, struct xlb_scratch *x, struct pkt *p, __u16 be_port, __u32 ext,
				    __u16 *port)
{
	__builtin_memset(&x->rk, 0, sizeof(x->rk));
	x->rk.family = p->family;
	x->rk.proto = p->proto;
	x->rk.rport = be_port;
	__builtin_memcpy(x->rk.raddr, x->be, 16);
	__builtin_memset(&x->rv, 0, sizeof(x->rv));
	x->rv.cport = p->sport;
	x->rv.fport = p->dport;
	x->rv.ext_net = ext;
	x->rv.isn = x->isn;
	/* A UDP request may be answered any time, and no reset can go ahead
	 * of a datagram: its mapping starts as one the endpoint answered
	 * (XLB_REV_SYNACK), which no datagram takes before it expired (the
	 * synack mask below), so a pending answer never reaches a new
	 * client. */
	x->rv.flags = XLB_REV_HALF_OPEN | (x->syn ? XLB_REV_ISN : 0) | (p->proto == IPPROTO_UDP ? XLB_REV_SYNACK : 0);
	x->prev_flags = 0;
	__builtin_memcpy(x->rv.client, p->saddr, 16);
	__builtin_memcpy(x->rv.front, p->daddr, 16);
	__u64 now = bpf_ktime_get_ns();
	/* Held as long as the client's conntrack entry, which starts as an
	 * unanswered flow's; its packets extend the hold (xlb_hold). */
	x->rv.expires = now + CT_NEW_IN;
	/* A closed flow's port (below): what its entry carries, and by when
	 * it expires once silent XLB_PORT_QUIET. Worked out once, not in the
	 * loop, whose every branch the verifier walks 32 times. Not TCP:
	 * every bit, which no entry carries (the top ones are no flag's). */
	__u16 closed = CT_ASSURED | CT_FIN_ORIG | CT_FIN_REPLY;
	if (p->proto != IPPROTO_TCP)
		closed = 0xffff;
	__u64 quiet_since = now + CT_TCP_CLOSE - XLB_PORT_QUIET;
	/* Only a SYN takes a half open port whose endpoint answered: the
	 * reset sent ahead of it clears what the endpoint holds (xlb_in). A
	 * copy of anything else cannot be made a reset, and the endpoint's
	 * answers to the old flow would go to the new client (a mapping of
	 * layout version 2 may be an honest connection nobody spoke on). */
	__u32 synack = x->syn ? 0 : XLB_REV_SYNACK;
	/* Nor, expired, one whose flow is over: its endpoint may still have
	 * answered it. (Worked out here, not in the loop: the verifier.) */
	__u64 expired_by = p->proto == IPPROTO_TCP && !x->syn ? 0 : now;
	/* The first port tried is the one the tuple had: the one its entry
	 * names (a SYN starting it over after its reset or FINs), or else
	 * the one drawn from the flow, as its endpoint is (a flow whose entry
	 * was lost between its packets). A mapping naming this very tuple is
	 * taken as it is, and the endpoint sees one flow. Given another port,
	 * the old one would lose its owner and go to the next flow toward
	 * the endpoint, with the endpoint's answers to the old connection
	 * (still open there when the reset was forged). Toward another
	 * endpoint, the same port number is tried first: the old mapping
	 * then keeps an owner (the new entry names its port) as long as the
	 * new flow. The others by a random stride from it: a client whose
	 * first port another flow holds gets a new window on each try, not
	 * the same one again. (A stride, not a branch on the first try in
	 * the loop: the branch doubled the verifier's work on
	 * from_underlay.) */
	__u32 first = x->again ? (__u32)bpf_ntohs(x->again) - SNAT_PORT_MIN : (__u32)(lb_flow_hash(p) >> 32);
	x->rk.port = bpf_htons(SNAT_PORT_MIN + first % SNAT_PORT_RANGE);
	struct xlb_rev_val *mine = bpf_map_lookup_elem(&lace_xlb_rev, &x->rk);
	/* (Unless a pod's SNAT flow to the same endpoint holds the port now,
	 * as in the loop: its answers are that flow's. Nor for a SYN when the
	 * endpoint held more than a request: a new connection, or a forged
	 * SYN on a lost entry's tuple, whose unanswered entry would cut the
	 * hold to seconds; the search below keeps the port held.) */
	struct snat_val *msn = bpf_map_lookup_elem(&lace_snat, &x->rk);
	if (mine && !(msn && snat_owner((struct snat_key *)&x->rk, msn, &x->ek)) && mine->cport == p->sport &&
	    mine->fport == p->dport && mine->ext_net == ext && eq16(mine->client, p->saddr) && eq16(mine->front, p->daddr) &&
	    ((mine->flags & XLB_REV_HALF_OPEN) || !x->syn)) {
		x->prev_isn = mine->isn;
		x->prev_flags = mine->flags;
		/* The segment of a flow whose entry was lost: the mapping's
		 * hold stays (xlb_hold), and what the endpoint showed. */
		if (mine->expires > x->rv.expires)
			x->rv.expires = mine->expires;
		if (!(mine->flags & XLB_REV_HALF_OPEN))
			x->rv.flags &= ~XLB_REV_HALF_OPEN;
		if (!x->syn) {
			x->rv.isn = mine->isn;
			x->rv.eisn = mine->eisn;
			x->rv.flags |= mine->flags & (XLB_REV_ISN | XLB_REV_SYNACK | XLB_REV_EISN);
			/* Its ACK of the endpoint's SYN-ACK, as xlb_port_held
			 * takes it: the handshake's last ACK may be the first
			 * packet after the entry was lost. */
			if (xlb_client_saw_synack(skb, p, &x->rv))
				x->rv.flags &= ~XLB_REV_HALF_OPEN;
		} else if (x->isn == mine->isn) {
			/* The same SYN again (its entry lost): the same request
			 * at the endpoint, whose SYN-ACK stays recorded. */
			x->rv.eisn = mine->eisn;
			x->rv.flags |= mine->flags & (XLB_REV_SYNACK | XLB_REV_EISN);
		}
		bpf_map_update_elem(&lace_xlb_rev, &x->rk, &x->rv, BPF_ANY);
		*port = x->rk.port;
		return 0;
	}
	__u32 stride = bpf_get_prandom_u32() | 1;
	__u16 steal = 0;
	__u64 steal_expires = ~0ULL;
	__u32 steal_isn = 0;
	__u32 steal_flags = 0;
	for (int i = 0; i < SNAT_TRIES; i++) {
		x->rk.port = bpf_htons(SNAT_PORT_MIN + (first + i * stride) % SNAT_PORT_RANGE);
		/* A pod's SNAT flow to the same endpoint (outside the cluster:
		 * a hostNetwork pod's node) holds it: its answers are that
		 * flow's. */
		struct snat_val *sn = bpf_map_lookup_elem(&lace_snat, &x->rk);
		if (sn && snat_owner((struct snat_key *)&x->rk, sn, &x->ek))
			continue;
		if (!bpf_map_update_elem(&lace_xlb_rev, &x->rk, &x->rv, BPF_NOEXIST)) {
			*port = x->rk.port;
			return 0;
		}
		/* A port whose flow is over is taken again: once its mapping
		 * expired and no client's conntrack entry names the port, or
		 * once that TCP flow, assured, closed
		 * by FINs both ways and stayed silent XLB_PORT_QUIET. Holding
		 * FIN-closed ports until the entry expired (CT_TCP_CLOSE after
		 * the last packet) capped new connections through a NodePort to
		 * an endpoint on another node at SNAT_PORT_RANGE / 10 s, about
		 * 450 a second. Nothing checks a FIN's sequence number, and the
		 * client is outside: anybody on the path can forge both FINs of
		 * a live flow, so a flow that still talks keeps its port (each
		 * packet refreshes expires), as it did when only the expiry
		 * freed it; a forged pair shortens an idle flow's hold from
		 * CT_TCP_CLOSE to the quiet time. A reset, which comes from
		 * outside here too, frees nothing before the expiry.
		 * An endpoint that closed first keeps the old connection in
		 * TIME_WAIT: its kernel takes the new SYN when its sequence
		 * number or timestamp is the newer, and otherwise answers with
		 * an ACK that the new client resets, which ends the TIME_WAIT,
		 * and the client's retransmitted SYN gets through. */
		struct xlb_rev_val *cur = bpf_map_lookup_elem(&lace_xlb_rev, &x->rk);
		if (!cur)
			continue;
		__builtin_memset(&x->ek, 0, sizeof(x->ek));
		x->ek.net_id = cur->ext_net;
		x->ek.family = p->family;
		x->ek.proto = p->proto;
		x->ek.lport = cur->fport;
		x->ek.rport = cur->cport;
		__builtin_memcpy(x->ek.laddr, cur->front, 16);
		__builtin_memcpy(x->ek.raddr, cur->client, 16);
		struct ct_val *owner = ct_lookup(&x->ek);
		if (!owner || !(owner->flags & CT_SNAT) || owner->snat_port != x->rk.port) {
			/* No entry names the port any more: it was lost (the
			 * shared lace_ct evicts the idle under a flood), or its
			 * tuple went on elsewhere. The mapping is held until its
			 * own expiry, the last its flow's entry had: freeing it
			 * at once handed an idle live flow's port to the next
			 * client. Unless it is half open (a flood's, whose
			 * entries lace_ct_new evicts): the endpoint holds at most
			 * a request, which the reset ahead clears (xlb_in), and
			 * early drop stays possible. A TCP segment that is not a
			 * SYN takes only a half open one the endpoint never
			 * answered, expired or not (synack, expired_by): no reset
			 * can go ahead of it, and the endpoint's answers to the
			 * old flow would be the new client's. */
			if (cur->expires > expired_by && (cur->flags & (XLB_REV_HALF_OPEN | synack)) != XLB_REV_HALF_OPEN)
				continue;
		} else if (!((owner->flags & closed) == closed && owner->expires <= quiet_since)) {
			/* Early drop, as Linux's conntrack does when full: a flow
			 * whose endpoint holds at most a request (a bare SYN of a
			 * flood, a blind client's assured one) gives its port up
			 * when no port is free, an established one never. Of those
			 * tried, the one silent longest (by the mapping's hold,
			 * CT_NEW_IN after its last packet; its entry's expiry put
			 * a blind client's assured flow, 6 h, after any
			 * handshake): an honest handshake just answered (its last
			 * ACK on the way) is the youngest, and losing its port
			 * between SYN and ACK would send that ACK to another
			 * endpoint, which resets it. */
			if ((cur->flags & (XLB_REV_HALF_OPEN | synack)) == XLB_REV_HALF_OPEN && cur->expires < steal_expires) {
				steal = x->rk.port;
				steal_expires = cur->expires;
				steal_isn = cur->isn;
				steal_flags = cur->flags;
			}
			continue;
		}
		/* Copied, not judged here: a branch in this loop, which the
		 * verifier walks 32 times, costs it hundreds of thousands of
		 * instructions (xlb_in judges). */
		x->prev_isn = cur->isn;
		x->prev_flags = cur->flags;
		bpf_map_update_elem(&lace_xlb_rev, &x->rk, &x->rv, BPF_ANY);
		*port = x->rk.port;
		return 0;
	}
	if (!steal)
		return -1;
	x->prev_isn = steal_isn;
	x->prev_flags = steal_flags;
	x->rk.port = steal;
	bpf_map_update_elem(&lace_xlb_rev, &x->rk, &x->rv, BPF_ANY);
	*port = steal;
	return 0;
}

/* xlb_hold keeps mapping rv as long as its flow's entry ct, and a half
 * open one at most CT_NEW_IN from now. Else only a flow that is closing
 * shortens it: a new entry for the tuple (an unanswered flow's, after the
 * old one was lost) must not cut an established flow's hold to seconds
 * while the endpoint's connection may be open. */
static __always_inline void xlb_hold(struct xlb_rev_val *rv, struct ct_val *ct)
{
	if (ct_closing(ct) || ct->expires > rv->expires)
		rv->expires = ct->expires;
	/* A half open mapping, whatever its entry: a blind client's ACK
	 * assures the entry (6 h), and two packets then held a port, and a
	 * slot of lace_xlb_rev, for hours. An honest handshake leaves the
	 * state within its round trip. */
	__u64 cap = bpf_ktime_get_ns() + CT_NEW_IN;
	if ((rv->flags & XLB_REV_HALF_OPEN) && rv->expires > cap)
		rv->expires = cap;
}

/* xlb_port_held tells whether the node's port of a translated flow
 * (x->be:be_port, x->k its client's entry) is still this client's, ends
 * its half open state when the client's segment p shows it saw the
 * endpoint's SYN-ACK, and holds it on (xlb_hold): 0 when held, -1 when
 * evicted or handed to another client. */
static __always_inline int xlb_port_held(struct __sk_buff *skb, struct xlb_scratch *x, struct pkt *p, __u16 be_port, __u16 nport,
					 struct ct_val *ct)
{
	__builtin_memset(&x->rk, 0, sizeof(x->rk));
	x->rk.family = p->family;
	x->rk.proto = p->proto;
	x->rk.port = nport;
	x->rk.rport = be_port;
	__builtin_memcpy(x->rk.raddr, x->be, 16);
	struct xlb_rev_val *rv = bpf_map_lookup_elem(&lace_xlb_rev, &x->rk);
	if (!rv || rv->cport != p->sport || rv->fport != p->dport || !eq16(rv->client, p->saddr) || !eq16(rv->front, p->daddr))
		return -1;
	/* Not atomic (the programs are built for BPF v1: no atomic and/or):
	 * a clear lost to xlb_back writing the flags on another CPU is made
	 * again by the client's next segment, which acknowledges the same
	 * SYN-ACK until the endpoint sends data, which shows it in turn. */
	if ((rv->flags & XLB_REV_HALF_OPEN) && xlb_client_saw_synack(skb, p, rv))
		rv->flags &= ~XLB_REV_HALF_OPEN;
	xlb_hold(rv, ct);
	return 0;
}

/* xlb_restarts tells whether a SYN on the tuple of a closing flow from
 * outside starts it over. Not after the client's reset of an assured flow
 * (unless FINs closed it both ways): nothing checks a reset's sequence
 * number, so it may be forged, and a new entry for the forged SYN after it
 * would be an unanswered flow's, its node port free within seconds while
 * the endpoint's connection is still open. The SYN goes on as the flow's,
 * to the same endpoint from the same port: an open connection answers it
 * with a challenge ACK, which revives the entry (ct_refresh); one the
 * genuine reset closed takes it as a new connection, and its SYN-ACK
 * revives the entry (xlb_back). After the endpoint's own reset (final,
 * CT_RST_LOCAL, whatever came after it) a SYN starts the flow over: else
 * a blind client could keep a refused flow assured with a SYN now and
 * then, its port never early dropped. */
static __always_inline int xlb_restarts(struct ct_val *ct)
{
	__u16 f = ct->flags;
	if ((f & (CT_ASSURED | CT_RST | CT_RST_REPLY | CT_RST_LOCAL)) == (CT_ASSURED | CT_RST) &&
	    (f & (CT_FIN_ORIG | CT_FIN_REPLY)) != (CT_FIN_ORIG | CT_FIN_REPLY))
		return 0;
	return ct_closing(ct);
}

/* xlb_in serves a packet from outside to an external frontend: the
 * source's external network must reach the service's ClusterIP (and lie
 * in its loadBalancerSourceRanges); the flow keeps its endpoint in
 * conntrack, keyed from the frontend's side in the client's external
 * network. An endpoint on this node gets the packet with the client's
 * address (CT_REV_NAT turns its answers back); one elsewhere, with
 * externalTrafficPolicy Cluster, gets it from this node's address. */
static __noinline int xlb_in(struct __sk_buff *skb, struct pkt *p)
{
	__u32 zero = 0;
	struct xlb_scratch *x = bpf_map_lookup_elem(&lace_xlb_scratch, &zero);
	if (!x)
		return drop(DROP_ADJUST);
	x->ra.l4_off = 0; /* the scratch outlives the packet */
	struct svc_val *svp = frontend(p->family, p->proto, p->dport, p->daddr);
	if (!svp)
		return drop(DROP_NO_SERVICE_PORT);
	/* An outside client: no LB_IN_CLUSTER, externalTrafficPolicy Local
	 * keeps it on the frontend's own (node-local) endpoints. A source in
	 * no external network is refused as such, after a closed frontend. */
	struct svc_val sv = *svp;
	svp = &sv;
	__u32 ext = classify(p);
	int why = lb_admit(&svp, ext, p->family, p->proto, p->daddr, p->saddr, 0, 0);
	if (why)
		return drop(!ext && why == DROP_ISOLATED ? DROP_UNCLASSIFIED : why);
	if (p->ttl <= 1)
		return drop(DROP_TTL);

	ct_key_of(&x->k, ext, p, 0);
	struct ct_val *ct = ct_lookup(&x->k);
	__u16 be_port, nport = 0;
	x->again = ct && (ct->flags & (CT_SERVICE | CT_SNAT)) == (CT_SERVICE | CT_SNAT) ? ct->snat_port : 0;
	if (ct && (ct->flags & CT_SERVICE) && !(is_tcp_syn(p) && xlb_restarts(ct))) {
		__builtin_memcpy(x->be, ct->nat_addr, 16);
		be_port = ct->nat_port;
		nport = ct->flags & CT_SNAT ? ct->snat_port : 0;
		ct_refresh(ct, p, 1);
		/* The node's port must still be this flow's (an evicted or
		 * reused one would hand its answers to somebody else): else the
		 * flow starts over. */
		if (nport && xlb_port_held(skb, x, p, be_port, nport, ct))
			ct = NULL;
	} else {
		ct = NULL;
	}
	if (!ct) {
		nport = 0;
		why = lb_no_endpoint(&sv);
		if (why)
			return drop(why);
		if (lb_pick(&sv, p->family, p->saddr, p->saddr, LB_ANY, lb_flow_hash(p), &x->ak, &x->av, x->be, &be_port))
			return drop(DROP_NO_BACKEND);
		__builtin_memset(&x->epk, 0, sizeof(x->epk));
		x->epk.net_id = sv.net_id;
		x->epk.family = p->family;
		__builtin_memcpy(x->epk.addr, x->be, 16);
		if (!bpf_map_lookup_elem(&lace_endpoints, &x->epk) && !host_addr(p->family, x->be)) {
			/* Elsewhere: only Cluster's endpoints are (Local's are
			 * all here; a hostNetwork pod of this node is at one of
			 * its addresses). */
			if (!(sv.flags & SVC_SNAT))
				return drop(DROP_NO_LOCAL_BACKEND);
			/* Only a SYN with its own header (a later fragment carries
			 * its first fragment's flags, not a header) records a
			 * sequence number, or is preceded by a reset: a copy of
			 * anything else turned into a reset would corrupt it. */
			x->isn = 0;
			x->syn = 0;
			if (is_tcp_syn(p) && p->frag != PKT_FRAG_LATER) {
				if (bpf_skb_load_bytes(skb, p->l4_off + 4, &x->isn, 4))
					return drop(DROP_ADJUST);
				x->syn = 1;
			}
			if (xlb_port(skb, x, p, be_port, ext, &nport)) {
				__builtin_memset(&x->fk, 0, sizeof(x->fk));
				x->fk.family = p->family;
				x->fk.proto = p->proto;
				x->fk.rport = be_port;
				__builtin_memcpy(x->fk.raddr, x->be, 16);
				snat_exhausted(&x->fk);
				return drop(DROP_SNAT);
			}
			/* The port's last flow, if it is not this one: a SYN
			 * retransmitted after its entry was lost carries the same
			 * sequence number, and its own request at the endpoint is
			 * what it continues. (The number, not the tuple, tells:
			 * another flow with the same number sends no reset, as
			 * before resets existed.) */
			if (x->syn && (x->prev_flags & (XLB_REV_HALF_OPEN | XLB_REV_ISN)) == (XLB_REV_HALF_OPEN | XLB_REV_ISN) &&
			    x->prev_isn != x->isn) {
				x->ra.seq = bpf_htonl(bpf_ntohl(x->prev_isn) + 1);
				x->ra.l4_off = 1;
			}
		}
		__builtin_memset(&x->v, 0, sizeof(x->v));
		x->v.peer_net = sv.net_id;
		x->v.flags = CT_SERVICE | (nport ? CT_SNAT : 0);
		x->v.snat_port = nport;
		x->v.nat_port = be_port;
		__builtin_memcpy(x->v.nat_addr, x->be, 16);
		ct_refresh(&x->v, p, 1);
		ct_insert(&x->k, &x->v);
		count(FWD_SERVICE);
	}

	/* Elsewhere, it goes encapsulated: one that would not fit earns its
	 * sender fragmentation needed / packet too big (the caller sends it,
	 * quoting the packet as it came) while it is untouched. A later
	 * fragment quotes no ports: the first's error taught the sender. */
	if (nport) {
		struct lace_config *cfg = config();
		__u32 mtu = 0;
		if (cfg && too_big(skb, p, cfg->underlay_ifindex, &mtu)) {
			if (p->frag == PKT_FRAG_LATER)
				return drop(DROP_MTU);
			p->mtu = mtu;
			return RET_TOO_BIG;
		}
	}

	__builtin_memcpy(x->front, p->daddr, 16);
	__u16 fport = p->dport;
	if (dec_ttl(skb, p) || nat_rewrite(skb, p, 0, x->be, be_port))
		return drop(DROP_ADJUST);
	__builtin_memcpy(p->daddr, x->be, 16);
	p->dport = be_port;

	if (!nport) {
		__u32 ifindex = 0;
		__u8 macs[12] = {};
		/* An endpoint at this node's own address (a hostNetwork pod):
		 * the node's stack takes the packet, and to_underlay turns its
		 * answers back into the frontend's (host_answer), by the
		 * endpoint's side keyed in the nodes' context. */
		int host = host_addr(p->family, x->be);
		if (!host && local_pod(sv.net_id, p->family, x->be, &ifindex, macs))
			return drop(DROP_NO_ENDPOINT);
		/* The client's address is kept: the endpoint's ingress
		 * policies decide on it, as on any outside source. */
		if (!host && pol_denied(ifindex, POL_IN, ext, p))
			return drop(DROP_POLICY);
		/* The endpoint's side: its answers leave from the frontend. */
		ct_key_of(&x->ek, host ? NODE_NET_ID : sv.net_id, p, 0);
		struct ct_val *fl = ct_lookup(&x->ek);
		if (fl && (fl->flags & CT_REV_NAT) && !(is_tcp_syn(p) && ct_closing(fl))) {
			/* The client's entry moves on by itself: the pod's
			 * answers update it too (rev_nat in pod.c). */
			ct_refresh(fl, p, 1);
			ct_settle(&x->ek);
			ct_settle(&x->k);
		} else {
			__builtin_memset(&x->v, 0, sizeof(x->v));
			x->v.peer_net = ext;
			x->v.flags = CT_REV_NAT;
			x->v.nat_port = fport;
			__builtin_memcpy(x->v.nat_addr, x->front, 16);
			ct_refresh(&x->v, p, 1);
			ct_insert(&x->ek, &x->v);
		}
		if (host) {
			count(FWD_HOST);
			return TC_ACT_OK;
		}
		if (set_macs(skb, macs, macs + 6))
			return drop(DROP_ADJUST);
		count(FWD_FROM_EXTERNAL);
		return bpf_redirect_peer(ifindex, 0);
	}

	/* Elsewhere: from this node's address, in the nodes' context. */
	ct_settle(&x->k);
	struct lace_config *cfg = config();
	if (!cfg)
		return drop(DROP_FIB);
	__builtin_memset(x->node, 0, 16);
	if (p->family == LACE_FAMILY_V4) {
		if (!(cfg->flags & LACE_CFG_HAS_V4))
			return drop(DROP_FIB);
		__builtin_memcpy(x->node, cfg->underlay_ip4, 4);
	} else {
		__builtin_memcpy(x->node, cfg->underlay_ip6, 16);
	}
	__builtin_memset(&x->rtk, 0, sizeof(x->rtk));
	x->rtk.prefixlen = 64 + 128;
	x->rtk.net_id = sv.net_id;
	x->rtk.family = p->family;
	__builtin_memcpy(x->rtk.addr, x->be, 16);
	struct route_val *rv = bpf_map_lookup_elem(&lace_routes, &x->rtk);
	if (rv && (rv->flags & (ROUTE_EXTERNAL | ROUTE_DENY | ROUTE_SERVICE)) == ROUTE_EXTERNAL) {
		/* An endpoint outside the cluster that the service's network
		 * reaches (a hostNetwork pod at another node's address: the
		 * model admits no other node address, docs/security.md): plain
		 * IP from this node's address and port, as the service's pods
		 * reach it with SNAT; its answers come back to that port
		 * (xlb_back from to_host). */
		if (nat_rewrite(skb, p, 1, x->node, nport))
			return drop(DROP_ADJUST);
		if (x->ra.l4_off)
			x->ra.l4_off = p->l4_off;
		return send_fib_ahead(skb, p->family, x->node, x->be, FWD_FROM_EXTERNAL, &x->ra);
	}
	if (!rv || (rv->flags & (ROUTE_LOCAL | ROUTE_SUBNET | ROUTE_EXTERNAL | ROUTE_DENY | ROUTE_CLOSED | ROUTE_SERVICE)) ||
	    rv->dst_net != sv.net_id)
		return drop(DROP_ISOLATED);
	__builtin_memcpy(x->sid, rv->sid, 16);
	x->sid[SID_SRC_NET_BYTE] = NODE_NET_ID >> 8;
	x->sid[SID_SRC_NET_BYTE + 1] = NODE_NET_ID & 0xff;
	if (nat_rewrite(skb, p, 1, x->node, nport))
		return drop(DROP_ADJUST);
	count(FWD_FROM_EXTERNAL);
	if (x->ra.l4_off)
		x->ra.l4_off = p->l4_off;
	return encap_and_send_ahead(skb, p, x->sid, 0, &x->ra);
}

/* xlb_shows_connection tells whether the endpoint's TCP answer p shows an
 * established connection on the mapping's port (1), and records its
 * SYN-ACK: its own sequence number goes to rv->eisn (XLB_REV_EISN, for
 * the client's ACK: xlb_client_saw_synack), the client's sequence number
 * as the endpoint's request has it (the SYN-ACK's acknowledgment - 1; not
 * the client's SYN that xlb_port saw, which may not be the one the
 * endpoint took) to rv->isn, for this test and for the reset ahead
 * (XLB_REV_SYNACK). XLB_SYNACK_AGAIN: the recorded SYN-ACK retransmitted,
 * which renews no half open hold. Shown: an ACK (neither a SYN nor a
 * reset) that carries data, or, after a SYN-ACK, that acknowledges more
 * of the client than that SYN. The endpoint accepts data, and sends it,
 * only on a connection, once the client acknowledged its SYN-ACK, which a
 * blind client (a spoofed source) never saw; a request or a TIME_WAIT
 * sends none (a connection revived by a segment after its mapping was
 * gone has no SYN-ACK recorded, and its data shows it). A bare ACK of
 * the SYN alone shows nothing (a request answers a stray segment with
 * one), nor does a bare ACK without a SYN-ACK before it (a TIME_WAIT's). */
#define XLB_SYNACK_AGAIN 2

static __always_inline int xlb_shows_connection(struct __sk_buff *skb, struct pkt *p, struct xlb_rev_val *rv)
{
	if (p->frag == PKT_FRAG_LATER)
		return 0;
	__u8 f = p->tcp_flags & (TCP_SYN | TCP_RST | TCP_ACK);
	if (f != TCP_ACK && f != (TCP_SYN | TCP_ACK))
		return 0;
	__u32 ack;
	if (bpf_skb_load_bytes(skb, p->l4_off + 8, &ack, 4))
		return 0;
	if (f == (TCP_SYN | TCP_ACK)) {
		__u32 seq;
		if (bpf_skb_load_bytes(skb, p->l4_off + 4, &seq, 4))
			return 0;
		/* The same SYN-ACK again: the endpoint retransmits it to a
		 * client that never acknowledged it (a blind one's) for up to
		 * a minute, and each would renew a half open hold. */
		if ((rv->flags & XLB_REV_EISN) && rv->eisn == seq)
			return XLB_SYNACK_AGAIN;
		rv->eisn = seq;
		rv->isn = bpf_htonl(bpf_ntohl(ack) - 1);
		rv->flags |= XLB_REV_ISN | XLB_REV_SYNACK | XLB_REV_EISN;
		return 0;
	}
	if ((rv->flags & XLB_REV_SYNACK) && (__s32)(bpf_ntohl(ack) - bpf_ntohl(rv->isn) - 1) > 0)
		return 1;
	__u8 doff;
	__u16 len;
	if (bpf_skb_load_bytes(skb, p->l4_off + 12, &doff, 1))
		return 0;
	__u32 hdr = p->l4_off - p->l3_off + (doff >> 4) * 4;
	if (p->family == LACE_FAMILY_V4) {
		if (bpf_skb_load_bytes(skb, p->l3_off + 2, &len, 2))
			return 0;
		return bpf_ntohs(len) > hdr;
	}
	if (bpf_skb_load_bytes(skb, p->l3_off + 4, &len, 2))
		return 0;
	return bpf_ntohs(len) + sizeof(struct ipv6hdr) > hdr;
}

/* RET_NOT_XLB: xlb_back found no frontend flow the plain packet answers. */
#define RET_NOT_XLB 0x7003

/* xlb_back turns an endpoint's answer p to a flow xlb_in sent it from
 * this node into the frontend's answer to its outside client, and sends
 * it out of the underlay. flags: the decapsulation of an answer over SRv6
 * in the nodes' context (a pod's, p parsed after the outer header), or 0
 * for a plain one (an endpoint outside the cluster, a hostNetwork pod at
 * another node's address), which is RET_NOT_XLB when it answers no such
 * flow (a pod's SNAT flow, or the host's). */
static __noinline int xlb_back(struct __sk_buff *skb, struct pkt *p, __u64 flags, __u16 inner_proto)
{
	__u32 zero = 0;
	struct xlb_scratch *x = bpf_map_lookup_elem(&lace_xlb_scratch, &zero);
	if (!x)
		return drop(DROP_ADJUST);
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return flags ? drop(DROP_NO_ENDPOINT) : RET_NOT_XLB;
	__builtin_memset(&x->rk, 0, sizeof(x->rk));
	x->rk.family = p->family;
	x->rk.proto = p->proto;
	x->rk.port = p->dport;
	x->rk.rport = p->sport;
	__builtin_memcpy(x->rk.raddr, p->saddr, 16);
	struct xlb_rev_val *rvp = bpf_map_lookup_elem(&lace_xlb_rev, &x->rk);
	if (!flags && !rvp)
		return RET_NOT_XLB;
	if (!rvp || !host_addr(p->family, p->daddr))
		return drop(DROP_NO_ENDPOINT);
	x->rv = *rvp;
	if (p->ttl <= 1)
		return drop(DROP_TTL);

	/* The client's entry sees the answer (its TCP state and timeout). */
	__builtin_memset(&x->k, 0, sizeof(x->k));
	x->k.net_id = x->rv.ext_net;
	x->k.family = p->family;
	x->k.proto = p->proto;
	x->k.lport = x->rv.fport;
	x->k.rport = x->rv.cport;
	__builtin_memcpy(x->k.laddr, x->rv.front, 16);
	__builtin_memcpy(x->k.raddr, x->rv.client, 16);
	struct ct_val *ct = ct_lookup(&x->k);
	if (!ct || !(ct->flags & CT_SNAT) || ct->snat_port != x->rk.port)
		return drop(DROP_NO_ENDPOINT); /* the flow is over */
	/* A plain answer comes from outside the cluster, never from an
	 * inside address (a pod's answers come over SRv6, from its node). */
	if (!flags && outside_spoofed(p))
		return drop(DROP_OUTSIDE_SPOOF);
	/* Over SRv6 the answer is the endpoint's own (nobody outside can
	 * forge it, foreign_source): its reset is final, and its SYN-ACK to a
	 * SYN that went on after the client's reset (xlb_restarts) is a new
	 * connection, which revives the entry. An answer that shows a
	 * connection (xlb_shows_connection), or a UDP answer, ends the
	 * mapping's half open state. (A plain answer too: an endpoint at a
	 * node address is trusted no further than the fabric, as before.) */
	if (flags && p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_SYN | TCP_ACK)) == (TCP_SYN | TCP_ACK) &&
	    (ct->flags & (CT_RST | CT_RST_REPLY | CT_RST_LOCAL)) == CT_RST)
		ct->flags &= ~CT_RST;
	int shown = p->proto != IPPROTO_TCP ? 1 : xlb_shows_connection(skb, p, rvp);
	if (shown == 1)
		rvp->flags &= ~XLB_REV_HALF_OPEN;
	ct_refresh(ct, p, 0);
	if (flags && p->proto == IPPROTO_TCP && (p->tcp_flags & TCP_RST))
		ct->flags |= CT_RST_LOCAL;
	if (shown != XLB_SYNACK_AGAIN || !(rvp->flags & XLB_REV_HALF_OPEN))
		xlb_hold(rvp, ct);

	if (flags) {
		if (bpf_skb_adjust_room(skb, -(int)sizeof(struct ipv6hdr), BPF_ADJ_ROOM_MAC, flags) ||
		    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &inner_proto, 2, 0))
			return drop(DROP_ADJUST);
		p->l3_off = ETH_HLEN;
		p->l4_off -= sizeof(struct ipv6hdr);
	}
	if (dec_ttl(skb, p) || nat_rewrite(skb, p, 0, x->rv.client, x->rv.cport))
		return drop(DROP_ADJUST);
	__builtin_memcpy(p->daddr, x->rv.client, 16);
	if (nat_rewrite(skb, p, 1, x->rv.front, x->rv.fport))
		return drop(DROP_ADJUST);
	return send_fib(skb, p->family, x->rv.front, x->rv.client, FWD_REPLY_OUT);
}

/* xlb_reply turns an endpoint's answer over SRv6 in the nodes' context
 * into the frontend's (xlb_back). */
static __noinline int xlb_reply(struct __sk_buff *skb)
{
	__u8 nexthdr;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, nexthdr), &nexthdr, 1))
		return drop(DROP_DECAP_TRUNCATED);
	__u16 inner_proto;
	__u64 flags;
	if (decap_inner(nexthdr, &inner_proto, &flags))
		return drop(DROP_DECAP_PROTO); /* decap checked it: not reached */
	struct pkt p = {};
	if (parse_ip(skb, inner_proto, ETH_HLEN + sizeof(struct ipv6hdr), &p))
		return drop(DROP_DECAP_TRUNCATED);
	if (p.proto != IPPROTO_TCP && p.proto != IPPROTO_UDP)
		return drop(DROP_NO_ENDPOINT);
	/* Keyed in the SID's source network (the endpoint's): endpoints of
	 * different networks may share an address (overlapping subnets),
	 * and one must not take the other's datagram's ports. */
	__u8 sn[2];
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, daddr) + SID_SRC_NET_BYTE, sn, 2))
		return drop(DROP_DECAP_TRUNCATED);
	if (frag_track(&p, ((__u32)sn[0] << 8) | sn[1], NODE_NET_ID))
		return drop(DROP_FRAG_NO_FIRST);
	return xlb_back(skb, &p, flags, inner_proto);
}

/* foreign_source tells whether a decapsulated packet's inner source is a
 * pod (inside a pod subnet) that the sending node (outer source osrc)
 * does not hold: the source network's view must resolve it to a block of
 * another node whose SID lies in the sender's locator. A node speaks for
 * its own pods only; outside sources (transit it took from the fabric)
 * and node addresses are not pods. Out of line: decap's frame is on the
 * deepest chain. */
static __noinline int foreign_source(__u32 src_net, struct pkt *p, const void *osrc)
{
	struct class_key ck = {.prefixlen = 32 + 128, .family = p->family};
	__builtin_memcpy(ck.addr, p->saddr, 16);
	__u32 *kind = bpf_map_lookup_elem(&lace_inside, &ck);
	/* The nodes' context carries what xlb_in sends: the sending node's
	 * own address as inner source, never a pod, service or locator
	 * address. Without this, any node could claim any pod through it. */
	if (src_net == NODE_NET_ID)
		return kind != 0;
	if (!kind || *kind != INSIDE_POD_SUBNET)
		return 0;
	struct host_key hk = {.family = LACE_FAMILY_V6};
	__builtin_memcpy(hk.addr, osrc, 16);
	__u64 *loc = bpf_map_lookup_elem(&lace_node_locs, &hk);
	struct route_val *rv = view_lookup_src(src_net, p);
	if (!loc || !rv || (rv->flags & (ROUTE_LOCAL | ROUTE_SUBNET | ROUTE_EXTERNAL | ROUTE_DENY | ROUTE_SERVICE)) ||
	    rv->dst_net != src_net)
		return 1;
	return !eq8(rv->sid, loc);
}

/* l2_foreign_source tells whether the source of a switched packet of
 * network net_id from node osrc is not placed there: its Neighbor's MAC
 * must live at that node (its FDB entry's SID in the node's locator), as
 * a flooded frame's (l2_flood_in). Views do not hold learned addresses,
 * so foreign_source cannot judge a switched source. */
static __noinline int l2_foreign_source(__u32 net_id, struct pkt *p, const __u8 *osrc)
{
	struct l2_neigh_key nk = {.net_id = net_id, .family = p->family};
	__builtin_memcpy(nk.addr, p->saddr, 16);
	struct l2_neigh_val *n = bpf_map_lookup_elem(&lace_l2_neigh, &nk);
	if (!n)
		return 1;
	struct fdb_key fk = {.net_id = net_id};
	__builtin_memcpy(fk.mac, n->mac, 6);
	struct fdb_val *f = bpf_map_lookup_elem(&lace_fdb, &fk);
	struct host_key hk = {.family = LACE_FAMILY_V6};
	__builtin_memcpy(hk.addr, osrc, 16);
	__u64 *loc = bpf_map_lookup_elem(&lace_node_locs, &hk);
	return !f || !loc || !fdb_from_node(&fk, f, loc);
}

/* l2_decap delivers a switched frame of l2 network net_id that came as its
 * IP packet (SID_L2_IP) to the port holding its destination (ifindex,
 * macs: the pod's MAC first), rebuilt with the source's MAC from the
 * neighbour table. Switching stays inside a network, and the source's
 * address was placed at the sending node (l2_foreign_source), and the
 * receiver's policies admitted it (decap, l2_pol); a Service endpoint's
 * answer to a translated flow leaves from the VIP (l2_unnat). */
static __noinline int l2_decap(struct __sk_buff *skb, struct pkt *p, __u32 net_id, __u32 ifindex, __u8 *macs)
{
	/* ND is answered on each node, never carried: one from another
	 * node would move a neighbour entry of the pod (l2_carries_nd). */
	if (p->family == LACE_FAMILY_V6 && (p->proto == IPPROTO_ICMPV6 || p->proto == 0 || p->proto == 43 || p->proto == 60) &&
	    l2_carries_nd(skb, p->l3_off))
		return drop(DROP_L2_NOT_FORWARDED);
	if (is_icmp_error(p) && l2_foreign_error(skb, p->l3_off, p->family))
		return drop(DROP_ICMP_IN_NOT_OURS);
	__u16 inner_proto;
	__u64 flags;
	if (decap_inner(p->family == LACE_FAMILY_V4 ? IPPROTO_IPIP : IPPROTO_IPV6, &inner_proto, &flags))
		return drop(DROP_DECAP_PROTO);
	struct l2_neigh_key nk = {.net_id = net_id, .family = p->family};
	__builtin_memcpy(nk.addr, p->saddr, 16);
	struct l2_neigh_val *n = bpf_map_lookup_elem(&lace_l2_neigh, &nk);
	if (!n)
		return drop(DROP_DECAP_FOREIGN);
	__builtin_memcpy(macs + 6, n->mac, 6);
	if (bpf_skb_adjust_room(skb, -(int)sizeof(struct ipv6hdr), BPF_ADJ_ROOM_MAC, flags) ||
	    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &inner_proto, 2, 0) ||
	    set_macs(skb, macs, macs + 6))
		return drop(DROP_ADJUST);
	/* The inner header now follows Ethernet. */
	p->l3_off = ETH_HLEN;
	p->l4_off -= sizeof(struct ipv6hdr);
	if (l2_unnat(skb, p, net_id))
		return drop(DROP_ADJUST);
	count(FWD_DECAP);
	return bpf_redirect_peer(ifindex, 0);
}

/* l2_flood_in_arp judges the ARP message at off, in a frame from source
 * MAC smac flooded from another node: -1 when it is a request its
 * learning network floods (l2_arp), from its sender's own address (the
 * network binds it to smac) for an address this node does not hold
 * either (one it holds is answered on every node, never carried); else
 * the program's verdict. A reply or a gratuitous ARP is a live
 * migration's announcement (fdb_from_node moved the MAC): done. */
static __always_inline int l2_flood_in_arp(struct __sk_buff *skb, __u32 off, __u32 net_id, const __u8 *smac)
{
	struct arp_eth4 arp;
	if (bpf_skb_load_bytes(skb, off, &arp, sizeof(arp)) || arp.htype != bpf_htons(1) ||
	    arp.ptype != bpf_htons(ETH_P_IP) || arp.hlen != 6 || arp.plen != 4)
		return drop(DROP_DECAP_PROTO);
	/* Copied out: a packed header's words sit unaligned on the stack. */
	__u32 spa, tpa;
	__builtin_memcpy(&spa, arp.spa, 4);
	__builtin_memcpy(&tpa, arp.tpa, 4);
	if (arp.oper != bpf_htons(ARP_REQUEST) || spa == tpa)
		return consumed();
	if (!spa)
		return drop(DROP_L2_NOT_FORWARDED);
	struct l2_neigh_key nk = {.net_id = net_id, .family = LACE_FAMILY_V4};
	__builtin_memcpy(nk.addr, &spa, 4);
	struct l2_neigh_val *n = bpf_map_lookup_elem(&lace_l2_neigh, &nk);
	if (!n || !mac_eq(n->mac, smac) || !mac_eq(arp.sha, smac))
		return drop(DROP_DECAP_FOREIGN);
	__builtin_memcpy(nk.addr, &tpa, 4);
	if (bpf_map_lookup_elem(&lace_l2_neigh, &nk))
		return drop(DROP_L2_UNKNOWN_NEIGH);
	return -1;
}

/* l2_flood_in delivers a flooded frame of l2 network net_id (DT2M: the
 * whole frame, next header 143) from node osrc to the network's ports on
 * this node. Its source MAC must live at that node (its FDB entry); an IP
 * frame's source address must be that MAC's. A broadcast or multicast of
 * IP goes to every port. What a learning network floods to find an
 * address or MAC it does not know goes to its learning ports only: an ARP
 * request or a plain neighbour solicitation for an address this node does
 * not hold either, a unicast frame to a MAC this node does not place
 * either (the sender's node did not know it; one known here would have
 * come switched). An ARP or RARP announcement of a live migration moves
 * the MAC (fdb_from_node) and goes nowhere. */
static __noinline int l2_flood_in(struct __sk_buff *skb, __u32 net_id, const __u8 *osrc)
{
	__u8 nexthdr;
	struct ethhdr inner;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, nexthdr), &nexthdr, 1) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(struct ipv6hdr), &inner, sizeof(inner)))
		return drop(DROP_DECAP_TRUNCATED);
	if (nexthdr != IPPROTO_ETHERNET)
		return drop(DROP_DECAP_PROTO);
	/* The source MAC lives at the sending node, or moves there: a live
	 * migration's announcement (l2_flood, L2_FLOOD_ANNOUNCE) does that and nothing else. */
	struct fdb_key fk = {.net_id = net_id};
	__builtin_memcpy(fk.mac, inner.h_source, 6);
	struct fdb_val *f = bpf_map_lookup_elem(&lace_fdb, &fk);
	struct host_key hk = {.family = LACE_FAMILY_V6};
	__builtin_memcpy(hk.addr, osrc, 16);
	__u64 *loc = bpf_map_lookup_elem(&lace_node_locs, &hk);
	if (!f || !loc || !fdb_from_node(&fk, f, loc))
		return drop(DROP_DECAP_FOREIGN);
	int unknown = !(inner.h_dest[0] & 1);
	if (unknown) {
		__builtin_memcpy(fk.mac, inner.h_dest, 6);
		if (bpf_map_lookup_elem(&lace_fdb, &fk))
			return drop(DROP_L2_UNKNOWN_DST);
	}
	__u32 l3 = ETH_HLEN + sizeof(struct ipv6hdr) + ETH_HLEN;
	int v4 = inner.h_proto == bpf_htons(ETH_P_IP);
	if (v4 || inner.h_proto == bpf_htons(ETH_P_IPV6))
		; /* IP: judged below (this shape keeps the stack within bounds) */
	else if (inner.h_proto == bpf_htons(ETH_P_RARP_))
		return consumed(); /* an announcement: done */
	else if (inner.h_proto != bpf_htons(ETH_P_ARP_) || unknown)
		return drop(DROP_DECAP_PROTO);
	else {
		int rc = l2_flood_in_arp(skb, l3, net_id, inner.h_source);
		if (rc != -1)
			return rc;
		unknown = 1;
	}
	if (v4 || inner.h_proto == bpf_htons(ETH_P_IPV6)) {
		/* The frame's IP source is its MAC's own address (the sending
		 * port's, as from_l2 checked there), and no neighbour discovery
		 * rides along but a plain solicitation for an address this node
		 * does not hold: a multicast advertisement would move every
		 * port's neighbour entry (the gateway's) to the sender's MAC. */
		struct l2_neigh_key nk = {.net_id = net_id, .family = v4 ? LACE_FAMILY_V4 : LACE_FAMILY_V6};
		if (bpf_skb_load_bytes(skb, l3 + (v4 ? offsetof(struct iphdr, saddr) : offsetof(struct ipv6hdr, saddr)), nk.addr,
				       v4 ? 4 : 16))
			return drop(DROP_DECAP_TRUNCATED);
		struct l2_neigh_val *n = bpf_map_lookup_elem(&lace_l2_neigh, &nk);
		if (!n || !mac_eq(n->mac, inner.h_source))
			return drop(DROP_DECAP_FOREIGN);
		/* A unicast frame's destination is no address the network holds,
		 * and no ICMP error (l2_unknown_ip_ok), as its sender's node
		 * checked. */
		if (unknown && !l2_unknown_ip_ok(skb, l3, &nk, v4))
			return drop(DROP_L2_UNKNOWN_DST);
		if (!v4 && l2_carries_nd(skb, l3)) {
			if (unknown || !ns_flood_ok(skb, l3, inner.h_source, nk.addr))
				return drop(DROP_L2_NOT_FORWARDED);
			if (bpf_map_lookup_elem(&lace_l2_neigh, &nk))
				return drop(DROP_L2_UNKNOWN_NEIGH);
			unknown = 1;
		}
	}
	/* An ARP request was padded by its sender (l2_flood_remote): what
	 * the outer headers leave behind is an IPv6 header's worth at least,
	 * as bpf_skb_adjust_room wants. */
	/* Computed here, not kept: this function's stack is at the limit of
	 * from_underlay's chain of calls. */
	__u64 flags = BPF_F_ADJ_ROOM_NO_CSUM_RESET | (v4 ? LACE_ADJ_ROOM_DECAP_L3_IPV4
							   : inner.h_proto == bpf_htons(ETH_P_IPV6) ? LACE_ADJ_ROOM_DECAP_L3_IPV6 : 0);
	if (bpf_skb_adjust_room(skb, -(int)(sizeof(struct ipv6hdr) + ETH_HLEN), BPF_ADJ_ROOM_MAC, flags) ||
	    bpf_skb_store_bytes(skb, 0, &inner, sizeof(inner), 0))
		return drop(DROP_ADJUST);
	l2_flood_local(skb, net_id, 0, unknown);
	count(unknown ? FWD_L2_UNKNOWN_FLOODED : FWD_L2_FLOODED);
	return consumed();
}

static __noinline int decap(struct __sk_buff *skb, struct ipv6hdr *outer)
{
	__u8 *sid = (__u8 *)&outer->daddr;
	int l2 = sid[SID_BEHAVIOUR_BYTE] == SID_L2_IP || sid[SID_BEHAVIOUR_BYTE] == SID_L2_FLOOD;
	if (sid[SID_BEHAVIOUR_BYTE] != SID_L3_DECAP && !l2)
		return drop(DROP_DECAP_SID);
	__u32 net_id = ((__u32)sid[SID_NET_BYTE] << 24) | ((__u32)sid[SID_NET_BYTE + 1] << 16) |
		       ((__u32)sid[SID_NET_BYTE + 2] << 8) | sid[SID_NET_BYTE + 3];
	__u32 src_net = ((__u32)sid[SID_SRC_NET_BYTE] << 8) | sid[SID_SRC_NET_BYTE + 1];
	/* Switching stays inside its network. */
	if (l2 && src_net != net_id)
		return drop(DROP_DECAP_SID);

	/* Only nodes of the cluster may inject into pods, and never this
	 * one through the fabric: its own SRv6 never comes back to it. (That
	 * the outer source is the node that sent it is to_underlay's work, on
	 * every node.) */
	struct host_key src = {.family = LACE_FAMILY_V6};
	__builtin_memcpy(src.addr, &outer->saddr, 16);
	if (!bpf_map_lookup_elem(&lace_nodes, &src) || bpf_map_lookup_elem(&lace_host_addrs, &src))
		return drop(DROP_DECAP_SOURCE);
	if (!bpf_map_lookup_elem(&lace_networks, &net_id) || !bpf_map_lookup_elem(&lace_networks, &src_net))
		return drop(DROP_DECAP_SID);
	if (sid[SID_BEHAVIOUR_BYTE] == SID_L2_FLOOD) {
		__u8 osrc[16];
		__builtin_memcpy(osrc, &outer->saddr, 16);
		return l2_flood_in(skb, net_id, osrc);
	}

	__u16 inner_proto;
	__u64 flags;
	if (decap_inner(outer->nexthdr, &inner_proto, &flags)) {
		if (outer->nexthdr == IPV6_FRAGMENT)
			return drop(DROP_DECAP_FRAGMENT);
		if (ipv6_ext_header(outer->nexthdr))
			return drop(DROP_DECAP_EXT_HEADER);
		return drop(DROP_DECAP_PROTO);
	}
	/* The inner header must be whole, and inside what the outer header
	 * says it carries. */
	__u32 inner_min = inner_proto == bpf_htons(ETH_P_IP) ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
	if (bpf_ntohs(outer->payload_len) < inner_min)
		return drop(DROP_DECAP_TRUNCATED);
	/* The nodes' context: xlb_reply, called by the caller (the stack). */
	if (net_id == NODE_NET_ID)
		return RET_NODE_CTX;
	struct pkt p = {};
	if (parse_ip(skb, inner_proto, ETH_HLEN + sizeof(struct ipv6hdr), &p))
		return drop(DROP_DECAP_TRUNCATED);

	/* A switched packet's source is judged by the l2 tables (l2_decap):
	 * its Neighbor's MAC lives at the sending node. */
	if (l2 ? l2_foreign_source(net_id, &p, (const __u8 *)&outer->saddr) : foreign_source(src_net, &p, &outer->saddr))
		return drop(DROP_DECAP_FOREIGN);
	if (frag_track(&p, src_net, net_id))
		return drop(DROP_FRAG_NO_FIRST);
	__u32 ifindex;
	__u8 macs[12];
	/* A switched frame may go to an address its network learned on a
	 * port here (l2_learned_port): no endpoint entry names it. */
	if (local_pod(net_id, p.family, p.daddr, &ifindex, macs) &&
	    (!l2 || l2_learned_port(net_id, p.family, p.daddr, &ifindex, macs)))
		return drop(DROP_NO_ENDPOINT);
	/* A switched frame: its receiver's ingress here (the sender's egress
	 * was decided on its node); from this frame, not l2_decap's, which
	 * is a call deeper. */
	if (l2) {
		int why = l2_pol(ifindex, POL_IN, net_id, &p);
		if (why)
			return drop(why);
	}
	if (l2)
		return l2_decap(skb, &p, net_id, ifindex, macs);
	int icmp_err = is_icmp_error(&p);
	if (icmp_err && icmp_in_refused(skb, &p, net_id, src_net))
		return drop(DROP_ICMP_IN_NOT_OURS);
	struct ct_val *ct;
	int rc = ct_track_in(net_id, src_net, &p, icmp_err, ifindex, &ct);
	if (rc)
		return drop(rc);
	/* A reply from a service endpoint to its client comes from the VIP. */
	int unnat = ct && (ct->flags & (CT_DNAT | CT_ORIGIN_LOCAL)) == (CT_DNAT | CT_ORIGIN_LOCAL);
	__u8 vip[16];
	__u16 vport = 0;
	if (unnat) {
		__builtin_memcpy(vip, ct->nat_addr, 16);
		vport = ct->nat_port;
	}

	/* Congestion the fabric marked on the outer header survives
	 * decapsulation (RFC 6040): CE on the outer sets CE on an ECN-capable
	 * inner packet. */
	__u8 outer_tc = (outer->priority << 4) | (outer->flow_lbl[0] >> 4);
	int set_ce = (outer_tc & 3) == 3 && (p.tos & 3) != 0 && (p.tos & 3) != 3;

	if (bpf_skb_adjust_room(skb, -(int)sizeof(struct ipv6hdr), BPF_ADJ_ROOM_MAC, flags))
		return drop(DROP_ADJUST);
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &inner_proto, 2, 0) ||
	    set_macs(skb, macs, macs + 6))
		return drop(DROP_ADJUST);
	if (set_ce && mark_ce(skb, &p))
		return drop(DROP_ADJUST);
	if (unnat) {
		/* The inner header now follows Ethernet. */
		p.l3_off = ETH_HLEN;
		p.l4_off -= sizeof(struct ipv6hdr);
		if (nat_rewrite(skb, &p, 1, vip, vport))
			return drop(DROP_ADJUST);
	}
	count(FWD_DECAP);
	return bpf_redirect_peer(ifindex, 0);
}

/* snat_in turns a reply to a node port SNAT handed out back into the
 * pod's packet and delivers it; anything else addressed to the node is
 * the host's (TC_ACT_OK). */
static __noinline int snat_in(struct __sk_buff *skb, struct pkt *p)
{
	int icmp = p->proto == IPPROTO_ICMP || p->proto == IPPROTO_ICMPV6;
	if (!(p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP ||
	      (icmp && (p->icmp_type == 0 || p->icmp_type == 129))))
		return TC_ACT_OK;
	struct snat_key sk = {.family = p->family, .proto = p->proto, .port = p->dport, .rport = icmp ? 0 : p->sport};
	__builtin_memcpy(sk.raddr, p->saddr, 16);
	struct snat_val *svp = bpf_map_lookup_elem(&lace_snat, &sk);
	if (!svp)
		return TC_ACT_OK;
	struct snat_val sv = *svp;
	/* Only while the pod's flow lives: an old mapping is closed, even
	 * before another flow takes its port. */
	struct ct_key k;
	struct ct_val *ct = snat_owner(&sk, &sv, &k);
	if (!ct)
		return drop(DROP_SNAT_CLOSED);
	__u32 ifindex;
	__u8 macs[12];
	if (local_pod(sv.net_id, p->family, sv.laddr, &ifindex, macs))
		return drop(DROP_NO_ENDPOINT);
	if (p->ttl <= 1)
		return drop(DROP_TTL);
	ct = ct_update(&k, ct, p, 0);
	/* An outside service endpoint (the API server behind the kubernetes
	 * Service) answers from the VIP the client addressed. */
	if (dec_ttl(skb, p) || nat_rewrite(skb, p, 0, sv.laddr, sv.lport) || unnat_reply(skb, p, ct) ||
	    set_macs(skb, macs, macs + 6))
		return drop(DROP_ADJUST);
	count(FWD_FROM_EXTERNAL);
	return bpf_redirect_peer(ifindex, 0);
}

/* snat_icmp_in turns an ICMP error about a SNAT flow (the outside host
 * quotes the packet as it left: from the node's address and port) back
 * into one about the pod's packet, and delivers it to the pod: its socket
 * learns at once that the port is unreachable or the path MTU smaller.
 * Rewritten: the outer destination, the quoted source address and port,
 * the quoted IPv4 header checksum, and the ICMP checksum for all of them.
 * The quoted L4 checksum is left alone (receivers do not check it). */
static __noinline int snat_icmp_in(struct __sk_buff *skb, struct pkt *p)
{
	__u32 inner = p->l4_off + 8;
	__u32 icsum = p->l4_off + 2;
	struct snat_key sk = {.family = p->family};
	__u32 saddr_off, inner_l4;
	__u16 old_ihc = 0;
	if (p->family == LACE_FAMILY_V4) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, inner, &ip, sizeof(ip)))
			return TC_ACT_OK;
		sk.proto = ip.protocol;
		__builtin_memcpy(sk.raddr, &ip.daddr, 4);
		inner_l4 = inner + ip.ihl * 4;
		saddr_off = inner + offsetof(struct iphdr, saddr);
		old_ihc = ip.check;
	} else {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, inner, &ip6, sizeof(ip6)))
			return TC_ACT_OK;
		sk.proto = ip6.nexthdr;
		__builtin_memcpy(sk.raddr, &ip6.daddr, 16);
		inner_l4 = inner + sizeof(ip6);
		saddr_off = inner + offsetof(struct ipv6hdr, saddr);
	}
	__u16 ports[3];
	if (bpf_skb_load_bytes(skb, inner_l4, ports, sizeof(ports)))
		return TC_ACT_OK;
	__u32 port_off = inner_l4;
	if (sk.proto == IPPROTO_TCP || sk.proto == IPPROTO_UDP) {
		sk.port = ports[0];
		sk.rport = ports[1];
	} else if (sk.proto == IPPROTO_ICMP || sk.proto == IPPROTO_ICMPV6) {
		sk.port = ports[2];
		port_off = inner_l4 + 4;
	} else {
		return TC_ACT_OK;
	}
	struct snat_val *svp = bpf_map_lookup_elem(&lace_snat, &sk);
	if (!svp)
		return TC_ACT_OK;
	struct snat_val sv = *svp;
	/* About a flow that is over: nobody to tell. */
	struct ct_key k;
	if (!snat_owner(&sk, &sv, &k))
		return drop(DROP_SNAT_CLOSED);
	__u32 ifindex;
	__u8 macs[12];
	if (local_pod(sv.net_id, p->family, sv.laddr, &ifindex, macs))
		return drop(DROP_NO_ENDPOINT);
	if (p->ttl <= 1)
		return drop(DROP_TTL);
	if (dec_ttl(skb, p))
		return drop(DROP_ADJUST);

	__u16 old_port = sk.port, new_port = sv.lport;
	if (p->family == LACE_FAMILY_V4) {
		__u32 node = *(__u32 *)p->daddr, pod = *(__u32 *)sv.laddr;
		/* Outer destination: the IP header checksum only (ICMPv4 has no
		 * pseudo header). */
		if (bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check), node, pod, 4) ||
		    bpf_skb_store_bytes(skb, p->l3_off + offsetof(struct iphdr, daddr), &pod, 4, 0))
			return drop(DROP_ADJUST);
		/* Quoted source and its header checksum (RFC 1624), both in the
		 * ICMP payload. */
		__u16 new_ihc = csum_fold(bpf_csum_diff(&node, 4, &pod, 4, (__u16)~old_ihc));
		if (bpf_l4_csum_replace(skb, icsum, node, pod, 4) ||
		    bpf_l4_csum_replace(skb, icsum, old_ihc, new_ihc, 2) ||
		    bpf_skb_store_bytes(skb, saddr_off, &pod, 4, 0) ||
		    bpf_skb_store_bytes(skb, inner + offsetof(struct iphdr, check), &new_ihc, 2, 0))
			return drop(DROP_ADJUST);
	} else {
		__s64 diff = bpf_csum_diff((__be32 *)p->daddr, 16, (__be32 *)sv.laddr, 16, 0);
		/* ICMPv6 sums the outer addresses (pseudo header) and the quoted
		 * source (payload): the same change, counted twice. */
		if (bpf_l4_csum_replace(skb, icsum, 0, diff, BPF_F_PSEUDO_HDR) ||
		    bpf_l4_csum_replace(skb, icsum, 0, diff, 0) ||
		    bpf_skb_store_bytes(skb, p->l3_off + offsetof(struct ipv6hdr, daddr), sv.laddr, 16, 0) ||
		    bpf_skb_store_bytes(skb, saddr_off, sv.laddr, 16, 0))
			return drop(DROP_ADJUST);
	}
	if (old_port != new_port &&
	    (bpf_l4_csum_replace(skb, icsum, old_port, new_port, 2) ||
	     bpf_skb_store_bytes(skb, port_off, &new_port, 2, 0)))
		return drop(DROP_ADJUST);
	if (set_macs(skb, macs, macs + 6))
		return drop(DROP_ADJUST);
	count(FWD_FROM_EXTERNAL);
	return bpf_redirect_peer(ifindex, 0);
}

/* from_outside handles plain IP that is not the node's: the source is
 * classified into an external network, whose view decides. */
static __noinline int from_outside(struct __sk_buff *skb, struct pkt *p)
{
	__u32 ext = classify(p);
	if (!ext)
		return drop(DROP_UNCLASSIFIED);
	struct route_val *rv = view_lookup(ext, p);
	/* Service VIPs are reached from pods here; from outside they come
	 * with NodePort and LoadBalancer. */
	if (!rv || (rv->flags & (ROUTE_DENY | ROUTE_SERVICE)))
		return drop(DROP_ISOLATED);
	if (rv->flags & ROUTE_EXTERNAL)
		return drop(DROP_NOT_LOCAL);
	if (rv->flags & ROUTE_CLOSED)
		return drop(DROP_ANONYMOUS);
	if (rv->flags & ROUTE_SUBNET)
		return drop(DROP_NO_ENDPOINT);
	if (p->ttl <= 1)
		return drop(DROP_TTL);
	__u32 flags = rv->flags, dst_net = rv->dst_net;
	__u8 sid[16];
	__builtin_memcpy(sid, rv->sid, 16);
	if (flags & ROUTE_LOCAL) {
		if (is_icmp_error(p) && icmp_in_refused(skb, p, dst_net, ext))
			return drop(DROP_ICMP_IN_NOT_OURS);
		return deliver_local(skb, p, dst_net, ext, FWD_FROM_EXTERNAL);
	}
	if (dec_ttl(skb, p))
		return drop(DROP_ADJUST);
	count(FWD_FROM_EXTERNAL);
	return encap_and_send(skb, p, sid, 0);
}

/* node_flow tells whether p (to the node) belongs to a flow of one of the
 * node's own sockets: a TCP socket past LISTEN (connecting, established,
 * closing, TIME_WAIT) or a connected UDP socket of exactly this address
 * and port pair. A frontend on the node's address (a hostPort may sit in
 * the ephemeral range the node connects from) must not take the answers
 * to the node's own connections: portmap's DNAT never does, conntrack
 * matching the node's flow first. Listeners and unbound UDP sockets are
 * left to the agent (a hostPort never takes a port a node socket serves).
 * Out of line: the tuple would not fit in from_underlay's frame. */
static __noinline int node_flow(struct __sk_buff *skb, struct pkt *p)
{
	struct bpf_sock_tuple t = {};
	__u32 len;
	if (p->family == LACE_FAMILY_V4) {
		__builtin_memcpy(&t.ipv4.saddr, p->saddr, 4);
		__builtin_memcpy(&t.ipv4.daddr, p->daddr, 4);
		t.ipv4.sport = p->sport;
		t.ipv4.dport = p->dport;
		len = sizeof(t.ipv4);
	} else {
		__builtin_memcpy(t.ipv6.saddr, p->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, p->daddr, 16);
		t.ipv6.sport = p->sport;
		t.ipv6.dport = p->dport;
		len = sizeof(t.ipv6);
	}
	struct bpf_sock *sk;
	int own = 0;
	if (p->proto == IPPROTO_TCP) {
		sk = bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
		if (sk) {
			own = sk->state != BPF_TCP_LISTEN;
			bpf_sk_release(sk);
		}
	} else if (p->proto == IPPROTO_UDP) {
		sk = bpf_sk_lookup_udp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
		if (sk) {
			own = sk->dst_port != 0;
			bpf_sk_release(sk);
		}
	}
	return own;
}

/* to_host handles plain IP addressed to the node: SNAT replies go back to
 * their pods, the rest to the host stack. */
static __always_inline int to_host(struct __sk_buff *skb, __u16 proto)
{
	struct pkt p = {};
	if (parse_ip(skb, proto, ETH_HLEN, &p))
		return TC_ACT_OK; /* the host drops what it cannot parse */
	/* Keyed in the source's external network (0: none). A later
	 * fragment without its first is the host's, whose reassembly decides
	 * (the node's own datagrams are fragmented too). */
	if (p.frag && frag_track(&p, classify(&p), 0))
		return TC_ACT_OK;
	if (is_icmp_error(&p))
		return snat_icmp_in(skb, &p);
	/* The node's SNAT ports (the top of the port range) carry answers
	 * to its pods' flows: no frontend on the node's address takes them.
	 * A frontend's client is outside: never at an inside address. */
	if (bpf_ntohs(p.dport) < SNAT_PORT_MIN && frontend(p.family, p.proto, p.dport, p.daddr)) {
		if (node_flow(skb, &p))
			return TC_ACT_OK;
		if (outside_spoofed(&p))
			return drop(DROP_OUTSIDE_SPOOF);
		int rc = xlb_in(skb, &p);
		return rc == RET_TOO_BIG ? too_big_out(skb, &p, p.mtu) : rc;
	}
	/* An endpoint outside the cluster answering a frontend's flow this
	 * node sent it (a hostNetwork pod on another node). */
	if (bpf_ntohs(p.dport) >= SNAT_PORT_MIN && !p.frag) {
		int rc = xlb_back(skb, &p, 0, 0);
		if (rc != RET_NOT_XLB)
			return rc;
	}
	return snat_in(skb, &p);
}

static __always_inline int outside(struct __sk_buff *skb, __u16 proto)
{
	struct pkt p = {};
	if (parse_ip(skb, proto, ETH_HLEN, &p))
		return drop(DROP_NOT_IP);
	/* Before classification: an inside source would otherwise pass as
	 * the external network whose prefix covers it, and take or answer
	 * the flows of the pod it claims to be. */
	if (outside_spoofed(&p))
		return drop(DROP_OUTSIDE_SPOOF);
	if (p.frag && frag_track(&p, classify(&p), 0))
		return drop(DROP_FRAG_NO_FIRST);
	if (frontend(p.family, p.proto, p.dport, p.daddr)) {
		int rc = xlb_in(skb, &p);
		return rc == RET_TOO_BIG ? too_big_out(skb, &p, p.mtu) : rc;
	}
	return from_outside(skb, &p);
}

static __always_inline int from_underlay_run(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return TC_ACT_OK;
	struct lace_config *cfg = config();
	if (!cfg)
		return TC_ACT_OK;
	int guard = cfg->flags & LACE_CFG_UNDERLAY_GUARD;
	/* A unicast frame sent to another MAC is not this node's to serve: a
	 * switch floods a frame whose destination it has not learned (a port
	 * that just moved) to every node, and a flow to a VIP held by another
	 * node, served here too, would take a second endpoint, which resets
	 * it. Its IP goes to the kernel only when addressed to the node (an
	 * upper device with a MAC of its own takes it, else the kernel drops
	 * it); the rest is dropped, as the guard drops plain IP: the kernel
	 * would route it to the node's pods past every check. ARP and ND are
	 * answered as before (a probe to a VIP's former holder's MAC). */
	int other = skb->pkt_type == PACKET_OTHERHOST;

	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end)
			return TC_ACT_OK; /* the host drops what it cannot parse */
		/* Broadcast and multicast frames and addresses are the host's
		 * (a kernel never forwards what was not sent to its MAC). */
		if (!guard || (eth->h_dest[0] & 1) || (bpf_ntohl(ip->daddr) >> 28) == 0xe ||
		    ip->daddr == 0xffffffff)
			return TC_ACT_OK;
		if (host_addr(LACE_FAMILY_V4, &ip->daddr))
			return other ? TC_ACT_OK : to_host(skb, bpf_htons(ETH_P_IP));
		if (other)
			return drop(DROP_OTHER_HOST);
		return outside(skb, bpf_htons(ETH_P_IP));
	}
	if (eth->h_proto == bpf_htons(ETH_P_ARP_))
		return arp_answer(skb);
	if (eth->h_proto != bpf_htons(ETH_P_IPV6))
		return TC_ACT_OK;
	struct ipv6hdr *outer = (void *)(eth + 1);
	if ((void *)(outer + 1) > end)
		return TC_ACT_OK;
	if (outer->nexthdr == IPPROTO_ICMPV6 && outer->hop_limit == 255) {
		int rc = ns_answer(skb);
		if (rc != TC_ACT_OK)
			return rc;
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
		eth = data;
		outer = (void *)(eth + 1);
		if ((void *)(outer + 1) > end)
			return TC_ACT_OK;
	}
	__u8 *d = (__u8 *)&outer->daddr;
	if (other) {
		if (!guard || d[0] == 0xff || (d[0] == 0xfe && (d[1] & 0xc0) == 0x80) ||
		    host_addr(LACE_FAMILY_V6, &outer->daddr))
			return TC_ACT_OK;
		return drop(DROP_OTHER_HOST);
	}
	if (eq8(&outer->daddr, cfg->locator)) {
		int rc = decap(skb, outer);
		return rc == RET_NODE_CTX ? xlb_reply(skb) : rc;
	}
	/* Multicast (ND, MLD) and link-local are the host's. */
	if (!guard || (eth->h_dest[0] & 1) || d[0] == 0xff || (d[0] == 0xfe && (d[1] & 0xc0) == 0x80))
		return TC_ACT_OK;
	if (host_addr(LACE_FAMILY_V6, &outer->daddr))
		return to_host(skb, bpf_htons(ETH_P_IPV6));
	return outside(skb, bpf_htons(ETH_P_IPV6));
}

/* Each program tells the drop it noted as it ends (flows.h). */
SEC("tcx/ingress")
int from_underlay(struct __sk_buff *skb)
{
	return flow_drop_tell(skb, from_underlay_run(skb), FLOW_AT_NODE);
}

/* host_answer turns the node stack's answer to a frontend's flow whose
 * endpoint is this node's own address (a hostNetwork pod; xlb_in handed
 * the client's packet to the stack) into the frontend's answer: from the
 * address and port the client addressed. The endpoint's side is keyed in
 * the nodes' context; the client's entry sees the answer too, as rev_nat
 * makes a pod's. Anything else the node sends passes untouched. */
static __noinline int host_answer(struct __sk_buff *skb, __u16 proto)
{
	/* Only what the node's stack sends is its answer. A packet it
	 * forwards (a pod's, which from_pod SNATs to the node's address and
	 * redirects here) came in on another interface: skb_iif, set by the
	 * kernel on receive, is 0 only for locally sent packets. Such a
	 * packet neither takes nor writes a record: a pod picking the IP ID
	 * (CAP_NET_RAW) would otherwise have its later fragment leave from
	 * the external IP of another tenant's frontend answering the same
	 * client, or clear that answer's record. */
	if (skb->ingress_ifindex)
		return TC_ACT_OK;
	struct pkt p = {};
	if (parse_ip(skb, proto, ETH_HLEN, &p) || (p.proto != IPPROTO_TCP && p.proto != IPPROTO_UDP))
		return TC_ACT_OK;
	/* An answer larger than the MTU (a node-local DNS cache's) leaves in
	 * fragments: a later one takes its first's ports, and so its
	 * translation; one whose first was no frontend's answer is the
	 * node's own. */
	if (p.frag == PKT_FRAG_LATER && frag_track(&p, NODE_NET_ID, 0))
		return TC_ACT_OK;
	struct ct_key k;
	ct_key_of(&k, NODE_NET_ID, &p, 1);
	struct ct_val *ct = ct_lookup(&k);
	if (!ct || !(ct->flags & CT_REV_NAT)) {
		/* The node's own datagram that reuses the ID of a frontend's
		 * answer (within the record's 10 s) owns the ID now: its
		 * later fragments must leave as its first did. */
		if (p.frag == PKT_FRAG_FIRST)
			frag_forget(&p, NODE_NET_ID, 0);
		return TC_ACT_OK;
	}
	/* Only a frontend's answer is recorded: the node's other large
	 * datagrams never churn lace_frags. */
	if (p.frag == PKT_FRAG_FIRST)
		frag_track(&p, NODE_NET_ID, 0);
	__u8 fa[16];
	__builtin_memcpy(fa, ct->nat_addr, 16);
	__u16 fp = ct->nat_port;
	__u32 peer = ct->peer_net;
	ct_update(&k, ct, &p, 0);
	struct ct_key ck = {.net_id = peer, .family = p.family, .proto = p.proto, .lport = fp, .rport = p.dport};
	__builtin_memcpy(ck.laddr, fa, 16);
	__builtin_memcpy(ck.raddr, p.daddr, 16);
	struct ct_val *cl = ct_lookup(&ck);
	if (cl && (cl->flags & (CT_SERVICE | CT_SNAT)) == CT_SERVICE)
		ct_update(&ck, cl, &p, 0);
	if (nat_rewrite(skb, &p, 1, fa, fp))
		return drop(DROP_ADJUST);
	return TC_ACT_OK;
}

/* to_underlay (tcx egress of the node's underlay interface) keeps the
 * node speaking only for itself. Another node believes SRv6 from an outer
 * source that is a node's address (decap): so nothing but Lace's own
 * encapsulation (LACE_MARK_ENCAP) may leave toward a node's locator, and
 * nothing may leave from another node's address. What it stops: a
 * hostNetwork pod or a node process forging SRv6 with another node's
 * outer source (raw sockets need only CAP_NET_RAW), or any other packet
 * impersonating another node. What it cannot stop: a process that
 * bypasses the qdisc layer (AF_PACKET with PACKET_QDISC_BYPASS, also
 * CAP_NET_RAW) or that holds CAP_NET_ADMIN (detaches this program); a
 * raw socket that sets the mark (CAP_NET_RAW) and this node's own outer
 * source reaches a locator, but speaks only for this node; and a host on the fabric, which no program here sees:
 * docs/security.md section 8. Before the agent has written the nodes and
 * locators, everything passes. */
static __always_inline int to_underlay_run(struct __sk_buff *skb)
{
	/* The mark alone proves nothing: SO_MARK needs only CAP_NET_RAW
	 * since Linux 5.17, which containers hold by default. So a marked
	 * packet skips only the locator check, and must still be IPv6 from
	 * one of this node's own addresses (encap_and_send always uses
	 * underlay_ip6): a raw socket may mark, but not speak for another
	 * node. */
	int marked = skb->mark == LACE_MARK_ENCAP;
	if (marked)
		skb->mark = 0;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return marked ? drop(DROP_NODE_FORGED) : TC_ACT_OK;
	struct host_key src = {};
	/* A VLAN tag (802.1Q, 802.1ad; up to two) hides nothing: the checks
	 * below apply to what it carries. A receiver strips a priority tag
	 * before its programs run, so a tagged forgery is still a forgery.
	 * A frame still tagged after two is refused: the checks would not see
	 * what it carries, and no node sends one (QinQ is two tags). */
	void *l3 = eth + 1;
	__be16 proto = eth->h_proto;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		if (l3 + 4 > end)
			return drop(DROP_NODE_FORGED);
		proto = *(__be16 *)(l3 + 2);
		l3 += 4;
	}
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD))
		return drop(DROP_NODE_FORGED);
	if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;
		if ((void *)(ip6 + 1) > end)
			return TC_ACT_OK;
		struct class_key ck = {.prefixlen = 32 + 128, .family = LACE_FAMILY_V6};
		__builtin_memcpy(ck.addr, &ip6->daddr, 16);
		src.family = LACE_FAMILY_V6;
		__builtin_memcpy(src.addr, &ip6->saddr, 16);
		if (marked) {
			if (!bpf_map_lookup_elem(&lace_host_addrs, &src))
				return drop(DROP_NODE_FORGED);
			return TC_ACT_OK;
		}
		__u32 *kind = bpf_map_lookup_elem(&lace_inside, &ck);
		if (kind && *kind == INSIDE_LOCATOR)
			return drop(DROP_NODE_FORGED);
		/* A Neighbour Advertisement (from a link-local source) must
		 * not claim another node's address: its target is checked as
		 * the source. No extension headers: the kernel sends ND bare. */
		struct icmp6hdr *ic = (void *)(ip6 + 1);
		if (ip6->nexthdr == IPPROTO_ICMPV6 && (void *)ic + 24 <= end && ic->icmp6_type == 136)
			__builtin_memcpy(src.addr, (__u8 *)ic + 8, 16);
	} else if (marked) {
		return drop(DROP_NODE_FORGED); /* Lace encapsulates only in IPv6 */
	} else if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = l3;
		if ((void *)(ip + 1) > end)
			return TC_ACT_OK;
		src.family = LACE_FAMILY_V4;
		__builtin_memcpy(src.addr, &ip->saddr, 4);
	} else if (proto == bpf_htons(ETH_P_ARP_)) {
		/* ARP (gratuitous or not) must not claim another node's
		 * address as its sender. */
		struct arp_eth4 *arp = l3;
		if ((void *)(arp + 1) > end)
			return TC_ACT_OK;
		src.family = LACE_FAMILY_V4;
		__builtin_memcpy(src.addr, arp->spa, 4);
	} else {
		return TC_ACT_OK;
	}
	if (!bpf_map_lookup_elem(&lace_host_addrs, &src))
		return bpf_map_lookup_elem(&lace_nodes, &src) ? drop(DROP_NODE_FORGED) : TC_ACT_OK;
	/* From the node's own address, untagged: maybe a hostNetwork
	 * endpoint's answer to a frontend's client. */
	if (l3 == (void *)(eth + 1) && (proto == bpf_htons(ETH_P_IP) || proto == bpf_htons(ETH_P_IPV6)))
		return host_answer(skb, proto);
	return TC_ACT_OK;
}

SEC("tcx/egress")
int to_underlay(struct __sk_buff *skb)
{
	return flow_drop_tell(skb, to_underlay_run(skb), FLOW_AT_NODE);
}

char __license[] SEC("license") = "GPL";
