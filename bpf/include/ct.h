/* Connection tracking and SNAT.
 *
 * Every node tracks the flows of its own pods, one entry per flow, keyed
 * from the pod's side: (the pod's network, protocol, pod address and port,
 * remote address and port). The value says who opened the flow and the
 * network of the other side, so a reply is routed in that network's
 * context even when subnets overlap, and so a packet that is neither a
 * flow the pod opened nor a reply of one is judged by the pod's view. The
 * node that sends a flow records it when the pod sends (from_pod); the
 * node that receives it records it at delivery, with the source network
 * the SID carried. Both ends therefore see both directions and keep TCP
 * state for timeouts.
 *
 * The maps are LRU hashes pinned by name: bounded memory, and an agent
 * restart keeps every established flow. */
#ifndef LACE_CT_H
#define LACE_CT_H

#include "lace.h"

struct ct_key {
	__u32 net_id; /* the local pod's network */
	__u8 family;
	__u8 proto;
	__u16 pad;
	__u16 lport; /* network order; ICMP echo: the identifier */
	__u16 rport;
	__u8 laddr[16]; /* the local pod */
	__u8 raddr[16];
};

struct ct_val {
#ifndef LACE_TEST_CT_V2
	__u64 expires; /* bpf_ktime_get_ns() deadline */
#endif
	__u32 peer_net; /* the other side's network (pod or external) */
	__u16 flags;
	__u16 snat_port; /* network order, with CT_SNAT */
#ifdef LACE_TEST_CT_V2
	/* Only in the test build lace_ctv2 (internal/datapath/gen.go): the
	 * same fields in another order, a layout the release would misread at
	 * the same size. Only the layout version tells them apart; the
	 * upgrade test migrates pinned flows to it. */
	__u64 expires;
#endif
	/* CT_SERVICE: the endpoint the flow was sent to; CT_DNAT: the VIP and
	 * port the client addressed, restored on the replies. */
	__u8 nat_addr[16];
	__u16 nat_port;
	__u16 pad;
};

/* ct_val.flags */
#define CT_ORIGIN_LOCAL 1 /* the local pod opened the flow */
#define CT_SEEN_REPLY 2
#define CT_FIN_ORIG 4
#define CT_FIN_REPLY 8
#define CT_RST 16
#define CT_SNAT 32 /* leaves with the node's address and snat_port */
#define CT_SERVICE 64 /* keyed by the client's tuple to a VIP: nat_addr/port is its endpoint */
#define CT_DNAT 128 /* a client's flow to an endpoint: replies come from nat_addr/port */
#define CT_REV_NAT 512 /* a pod's side of a flow to an external frontend: its answers leave from nat_addr/port */
#define CT_HAIRPIN 256 /* an endpoint's side of its own flow through its service: answers go back from nat_addr/port */
/* The opener spoke again after the reply (TCP: the handshake's last ACK;
 * UDP: a second datagram), as Linux's ASSURED: only then does a flow earn
 * the long timeouts. */
#define CT_ASSURED 1024
/* With CT_RST: the reset came from the side that did not open the flow.
 * Nothing checks a reset's sequence number, so anybody on the path can
 * forge one: a reset is believed only until the side it was sent to
 * speaks again (its stack refused it: out of window), and a port whose
 * flow the remote side reset is handed to another flow only once the
 * entry expired, never at once (see ct_port_free). */
#define CT_RST_REPLY 2048
/* With CT_RST: the reset left a pod of this node (from_pod saw it), or an
 * endpoint on another node over SRv6 (xlb_back), so nobody on the path
 * forged it. It is final: the side it was sent to speaking on does not
 * revive the flow, nor does a reset after it. Otherwise a spoofed outside host
 * could handshake blindly (SYN, an ACK for a SYN-ACK it never saw: the
 * flow is assured), ignore the pod's reset and send one more ACK, and
 * hold an established 6 h entry in lace_ct for four packets. */
#define CT_RST_LOCAL 4096
/* With CT_FIN_REPLY: the other side's FIN came before the opener's, so
 * the last ACK is the other side's, a round trip after the opener's FIN
 * (ct_port_free). */
#define CT_FIN_REPLY_FIRST 8192

#define NSEC 1000000000ULL
/* Timeouts: TCP as the kernel's conntrack orders them (an unanswered
 * SYN short, established long, closing short); UDP as Linux's since 5.x:
 * an exchange (a request and its answer, a DNS query) is held 30 s, and
 * only a stream, whose opener sends again after the answer (ASSURED),
 * 120 s; ICMP echo short. A SNAT port is held exactly that long, so the
 * UDP exchange's 30 s is what bounds the rate of new UDP flows toward one
 * outside destination (4536 ports / 30 s, about 150 a second). */
#define CT_TCP_SYN (60 * NSEC)
#define CT_TCP_EST (21600 * NSEC)
#define CT_TCP_CLOSE (10 * NSEC)
#define CT_UDP (30 * NSEC)
#define CT_UDP_REPLIED (120 * NSEC)
#define CT_OTHER (30 * NSEC)
/* A flow the other side opened and that is not assured yet (a bare SYN, a
 * datagram nobody answered, a handshake whose last ACK never came): a few
 * seconds, whatever its protocol. A flood is made of these. */
#define CT_NEW_IN (5 * NSEC)

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, struct ct_key);
	__type(value, struct ct_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_ct SEC(".maps");

/* Flows the other side opened (from another node, from outside, to a
 * frontend) live here until they are assured, then move to lace_ct. The
 * maps are LRU: a flood of new flows (SYNs, spoofed datagrams) evicts only
 * other unassured flows from this budget of its own, never an established
 * flow from lace_ct; and its entries expire after CT_NEW_IN. Linux's
 * conntrack gets the same from early_drop (a full table drops an
 * unassured entry first); Cilium keeps one LRU map and relies on its GC. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768);
	__type(key, struct ct_key);
	__type(value, struct ct_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_ct_new SEC(".maps");

/* Flows a local pod opened that are not answered yet wait here, apart from
 * those the other side opened (lace_ct_new): a host outside sending each
 * tuple of a flood twice sets the LRU's reference bit on its entries and
 * beats the second chance the kernel's LRU gives older entries, so in a
 * shared map it would evict the pods' pending connects, whose answers
 * would then find no flow (snat-closed, no-flow). Here a flood from
 * outside evicts only flows opened from outside, and a pod's flows to
 * silent destinations evict only pods' pending flows. There is no share
 * per pod: an LRU map has no per-key budget, and a count per pod cannot
 * be kept exact (eviction tells nobody); see docs/security.md, item 7. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768);
	__type(key, struct ct_key);
	__type(value, struct ct_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_ct_local SEC(".maps");

/* SNAT: the node's address and a port of its own stand for a pod toward
 * an outside address. Keyed by what the replies carry. */
struct snat_key {
	__u8 family;
	__u8 proto;
	__u16 port; /* the node's port (network order); ICMP: the echo id */
	__u16 rport; /* the remote port; 0 for ICMP */
	__u16 pad;
	__u8 raddr[16];
};

struct snat_val {
	__u32 net_id;
	__u16 lport; /* the pod's port or echo id (network order) */
	__u16 pad;
	__u8 laddr[16];
};

/* Not an LRU: an eviction would free the port of a live flow for the next
 * one toward the same destination, which would get the first one's
 * replies. Full, it fails closed (snat-failed); a mapping whose flow is
 * over is taken again by the next flow that picks its port, and the
 * agent sweeps the others out (Datapath.ReclaimSNAT). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct snat_key);
	__type(value, struct snat_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_snat SEC(".maps");

/* External frontends, externalTrafficPolicy Cluster with an endpoint on
 * another node: the flow leaves this node from its own address and a port
 * of it (the endpoint answers the node, over SRv6 in the nodes' context
 * NODE_NET_ID), and xlb_reply turns the answers back into the frontend's.
 * Keyed by what those answers carry: the node's port and the endpoint,
 * laid out as struct snat_key: an endpoint outside the cluster (a node's
 * address, for a hostNetwork pod) answers as plain IP to a port of the
 * node, like a pod's SNAT flow, so xlb_port skips a port lace_snat holds
 * toward the same endpoint. */
struct xlb_rev_key {
	__u8 family;
	__u8 proto;
	__u16 port;  /* the node's port (network order) */
	__u16 rport; /* the endpoint's port */
	__u16 pad;
	__u8 raddr[16]; /* the endpoint */
};

struct xlb_rev_val {
	__u8 client[16];
	__u8 front[16];
	__u16 cport;
	__u16 fport;
	__u32 ext_net; /* the client's external network (its conntrack entry's) */
	__u64 expires;
	/* The client's SYN sequence number (network order, XLB_REV_ISN): the
	 * SYN xlb_port saw, then the one the endpoint's SYN-ACK acknowledged
	 * (XLB_REV_SYNACK). While the mapping is XLB_REV_HALF_OPEN the
	 * endpoint may hold the flow half open, and a new flow given this port
	 * first resets it there (xlb_in). */
	__u32 isn;
	__u32 flags;
	/* The endpoint's SYN-ACK's sequence number (network order, with
	 * XLB_REV_EISN): the client that acknowledges exactly it saw the
	 * SYN-ACK (xlb_client_saw_synack). */
	__u32 eisn;
	__u32 pad;
};

/* Nobody has shown a connection on this port: the endpoint holds at most
 * a request. Every mapping starts so. What ends it is what a blind client
 * (a spoofed source, which never sees the endpoint's answers) cannot send:
 * the client's ACK of exactly the endpoint's SYN-ACK (xlb_in), the
 * endpoint's own answer that shows a connection (xlb_shows_connection:
 * after its SYN-ACK, it acknowledges data of the client, or carries data),
 * or a UDP answer (xlb_back). Any ACK assures the client's entry, a blind
 * one too; its mapping stays half open: held no longer than CT_NEW_IN
 * after its last packet (xlb_hold), then free, and early drop may take
 * it sooner. A connection never. */
#define XLB_REV_HALF_OPEN 1
/* isn is the client's SYN's. */
#define XLB_REV_ISN 2
/* isn is the one the endpoint's SYN-ACK acknowledged (its request's). */
#define XLB_REV_SYNACK 4
/* eisn is the endpoint's SYN-ACK's. Its own flag, not XLB_REV_SYNACK:
 * mappings of layout version 2 have that one with no eisn (0), and an ACK
 * of 1 would have ended their half open state. */
#define XLB_REV_EISN 8
/* Migrated from layout version 2 while half open: it may be an honest
 * connection nobody spoke on (no eisn to prove it), and the sweep keeps
 * it while its entry lives. Any rewrite drops it. */
#define XLB_REV_V2 16

/* Not an LRU, as lace_snat: an eviction freed an idle live flow's port,
 * and a SYN flood toward a few endpoints evicted them at will. Full, it
 * fails closed (snat-failed, counted per endpoint); xlb_port takes a
 * mapping whose flow is over again in place, and the agent sweeps the
 * others out (Datapath.ReclaimSNAT). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct xlb_rev_key);
	__type(value, struct xlb_rev_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_xlb_rev SEC(".maps");

/* SNAT ports lie above Linux's default ephemeral range (32768-60999), so
 * the node's own connections never collide with them. */
#define SNAT_PORT_MIN 61000
#define SNAT_PORT_RANGE 4536
#define SNAT_TRIES 32
/* How long a pod's SNAT port stays with its TCP flow once the flow closed
 * by FINs both ways and fell silent (snat_out): the last ACK passes first.
 * Handed on at the second FIN, the port's next flow took the pod's last
 * ACK (dropped snat-closed), and the outside host, still in LAST_ACK on
 * the tuple, answered that flow's SYN with an ACK for the old connection.
 * When the pod closed first, the last ACK is its own, a moment after the
 * host's FIN: SNAT_PORT_QUIET, short, as a port in it is held (a pod may
 * open thousands of connections a second to one destination: 4536 ports
 * per 0.1 s; half a second capped it near 8,000 a second). When the host
 * closed first (CT_FIN_REPLY_FIRST), the last ACK is the host's, a round
 * trip after the pod's FIN: SNAT_PORT_QUIET_RTT. */
#define SNAT_PORT_QUIET (NSEC / 10)
#define SNAT_PORT_QUIET_RTT NSEC
/* How long a NodePort flow's node port stays with its flow once the flow
 * closed by FINs both ways and fell silent (xlb_port): longer than a pod's
 * (SNAT_PORT_QUIET), as its client is outside and anybody on the path can
 * forge both FINs of an idle flow. */
#define XLB_PORT_QUIET (NSEC / 2)

/* SNAT exhaustion, per destination: which outside address, port and
 * protocol found no free port, how often and when last (the agent exports
 * it: metric and lacectl status). Keyed by a snat_key whose port is 0. */
struct snat_fail_val {
	__u64 count;
	__u64 last; /* bpf_ktime_get_ns() */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct snat_key);
	__type(value, struct snat_fail_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_snat_exhausted SEC(".maps");

static __always_inline int is_tcp_syn(struct pkt *p)
{
	return p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
}

/* ct_key_of builds the key of packet p seen from the pod at its source
 * (local_is_src) or at its destination. */
static __always_inline void ct_key_of(struct ct_key *k, __u32 net_id, struct pkt *p, int local_is_src)
{
	k->net_id = net_id;
	k->family = p->family;
	k->proto = p->proto;
	k->pad = 0;
	if (local_is_src) {
		k->lport = p->sport;
		k->rport = p->dport;
		__builtin_memcpy(k->laddr, p->saddr, 16);
		__builtin_memcpy(k->raddr, p->daddr, 16);
	} else {
		k->lport = p->dport;
		k->rport = p->sport;
		__builtin_memcpy(k->laddr, p->daddr, 16);
		__builtin_memcpy(k->raddr, p->saddr, 16);
	}
}

/* After the flow tables and their key: a flow event names a Service by
 * its entry. */
#include "policy.h"

/* ct_settled tells whether an entry belongs in lace_ct: a flow this side
 * opened once it was answered (or its hairpin), or one the other side
 * opened that is assured. Until then, a flow waits in a pending map
 * (lace_ct_local if the pod opened it, else lace_ct_new): a pod sending to
 * a thousand silent destinations (or its answers to clients whose flows
 * are gone) evicts only other unanswered flows, never an established one. */
static __always_inline int ct_settled(__u16 flags)
{
	return (flags & (CT_HAIRPIN | CT_ASSURED)) || (flags & (CT_ORIGIN_LOCAL | CT_SEEN_REPLY)) == (CT_ORIGIN_LOCAL | CT_SEEN_REPLY);
}

/* ct_forget_pending forgets k's unsettled entry, in whichever pending map
 * it waits (its origin picks the map; an agent of before lace_ct_local
 * left pods' pending flows in lace_ct_new). */
static __always_inline void ct_forget_pending(struct ct_key *k)
{
	bpf_map_delete_elem(&lace_ct_new, k);
	bpf_map_delete_elem(&lace_ct_local, k);
}

/* ct_promote moves k's assured entry v from its pending map to lace_ct and
 * returns it there. */
static __always_inline struct ct_val *ct_promote(struct ct_key *k, struct ct_val *v)
{
	if (bpf_map_update_elem(&lace_ct, k, v, BPF_ANY))
		return v;
	ct_forget_pending(k);
	return bpf_map_lookup_elem(&lace_ct, k);
}

/* ct_pending returns k's entry in the pending maps (the other side's
 * flows first: a tuple has one entry). */
static __always_inline struct ct_val *ct_pending(struct ct_key *k)
{
	struct ct_val *v = bpf_map_lookup_elem(&lace_ct_new, k);
	if (!v)
		v = bpf_map_lookup_elem(&lace_ct_local, k);
	return v;
}

/* ct_settle promotes k's entry once it is assured (called after a
 * packet that may have assured it, so a flood never evicts it from
 * its pending map before its next packet). */
static __always_inline void ct_settle(struct ct_key *k)
{
	struct ct_val *v = ct_pending(k);
	if (v && ct_settled(v->flags))
		ct_promote(k, v);
}

/* ct_insert records k's entry v in the map it belongs to (lace_ct once
 * settled; pending: lace_ct_local for a flow the pod opened, lace_ct_new
 * for one the other side opened), and forgets an older one of k in the
 * others. */
static __always_inline void ct_insert(struct ct_key *k, struct ct_val *v)
{
	if (ct_settled(v->flags)) {
		bpf_map_update_elem(&lace_ct, k, v, BPF_ANY);
		ct_forget_pending(k);
	} else if (v->flags & CT_ORIGIN_LOCAL) {
		bpf_map_update_elem(&lace_ct_local, k, v, BPF_ANY);
		bpf_map_delete_elem(&lace_ct_new, k);
		bpf_map_delete_elem(&lace_ct, k);
	} else {
		bpf_map_update_elem(&lace_ct_new, k, v, BPF_ANY);
		bpf_map_delete_elem(&lace_ct_local, k);
		bpf_map_delete_elem(&lace_ct, k);
	}
}

/* ct_lookup returns the live entry of k, or NULL (an expired one counts as
 * none: the next packet of that tuple is a new flow). */
static __always_inline struct ct_val *ct_lookup(struct ct_key *k)
{
	__u64 now = bpf_ktime_get_ns();
	struct ct_val *v = bpf_map_lookup_elem(&lace_ct, k);
	if (v && v->expires >= now)
		return v;
	v = ct_pending(k);
	if (!v || v->expires < now)
		return NULL;
	if (ct_settled(v->flags))
		return ct_promote(k, v);
	return v;
}

/* ct_refresh moves a flow's state on for packet p, sent by the side that
 * opened it (from_origin) or by the other. */
static __always_inline void ct_refresh(struct ct_val *v, struct pkt *p, int from_origin)
{
	__u16 f = v->flags;
	__u64 timeout = CT_OTHER;
	if (!from_origin)
		f |= CT_SEEN_REPLY;
	if (p->proto == IPPROTO_TCP) {
		if (p->tcp_flags & TCP_RST) {
			/* A reset known to be genuine (CT_RST_LOCAL) stays
			 * final: a later one, forged from outside, must not
			 * make the flow revivable again. */
			f = (f & ~CT_RST_REPLY) | CT_RST | (from_origin ? 0 : CT_RST_REPLY);
		} else if ((f & (CT_RST | CT_RST_LOCAL)) == CT_RST && !(p->tcp_flags & TCP_SYN) && !!from_origin == !!(f & CT_RST_REPLY)) {
			/* The side the reset was sent to speaks on: its stack
			 * refused it (out of window), the flow lives. */
			f &= ~(CT_RST | CT_RST_REPLY);
		}
		if ((p->tcp_flags & TCP_FIN) && !from_origin && !(f & (CT_FIN_ORIG | CT_FIN_REPLY)))
			f |= CT_FIN_REPLY_FIRST;
		if (p->tcp_flags & TCP_FIN)
			f |= from_origin ? CT_FIN_ORIG : CT_FIN_REPLY;
		/* The handshake's last ACK assures it: an ACK, neither a SYN
		 * again nor a reset (a flood's sources reset the answers they
		 * never asked for). */
		if (from_origin && (f & CT_SEEN_REPLY) && (p->tcp_flags & (TCP_SYN | TCP_RST | TCP_ACK)) == TCP_ACK)
			f |= CT_ASSURED;
		if ((f & CT_RST) || ((f & CT_FIN_ORIG) && (f & CT_FIN_REPLY)))
			timeout = CT_TCP_CLOSE;
		else if (f & CT_ASSURED)
			timeout = CT_TCP_EST; /* a forged answer never earns it */
		else
			timeout = CT_TCP_SYN;
	} else if (p->proto == IPPROTO_UDP) {
		if (from_origin && (f & CT_SEEN_REPLY))
			f |= CT_ASSURED;
		timeout = (f & CT_ASSURED) ? CT_UDP_REPLIED : CT_UDP;
	}
	if (!ct_settled(f) && !(f & CT_ORIGIN_LOCAL))
		timeout = CT_NEW_IN;
	v->flags = f;
	v->expires = bpf_ktime_get_ns() + timeout;
}

/* ct_create records a new flow of k. A TCP flow that is closing and sees a
 * new SYN starts over (port reuse). */
static __always_inline struct ct_val *ct_create(struct ct_key *k, __u32 peer_net, __u16 flags, __u16 snat_port,
						struct pkt *p, int from_origin)
{
	struct ct_val v = {.peer_net = peer_net, .flags = flags, .snat_port = snat_port};
	ct_refresh(&v, p, from_origin);
	ct_insert(k, &v);
	if (ct_settled(v.flags))
		return bpf_map_lookup_elem(&lace_ct, k);
	if (v.flags & CT_ORIGIN_LOCAL)
		return bpf_map_lookup_elem(&lace_ct_local, k);
	return bpf_map_lookup_elem(&lace_ct_new, k);
}

/* ct_closing tells whether a TCP entry is done, so that a SYN reusing
 * the tuple opens a new flow. */
static __always_inline int ct_closing(struct ct_val *v)
{
	return (v->flags & CT_RST) || ((v->flags & CT_FIN_ORIG) && (v->flags & CT_FIN_REPLY));
}

/* ct_port_free tells whether a live TCP entry's node port may go to
 * another flow now: reset by the side that opened it (a pod of this node:
 * the fabric cannot forge it), or closed by FINs both ways and silent long
 * enough for its last ACK to have passed (SNAT_PORT_QUIET; an entry
 * closed by a packet now expires CT_TCP_CLOSE from now). A reset from the
 * other side (which anybody on the path can forge) frees the port only
 * when the entry expires, CT_TCP_CLOSE after it if the flow stays
 * silent. */
static __always_inline int ct_port_free(struct ct_val *v)
{
	if ((v->flags & CT_RST) && !(v->flags & CT_RST_REPLY))
		return 1;
	if (!((v->flags & CT_FIN_ORIG) && (v->flags & CT_FIN_REPLY)))
		return 0;
	__u64 quiet = (v->flags & CT_FIN_REPLY_FIRST) ? SNAT_PORT_QUIET_RTT : SNAT_PORT_QUIET;
	return v->expires + quiet <= bpf_ktime_get_ns() + CT_TCP_CLOSE;
}

/* ct_update moves k's entry v on for packet p (sent by the opener or
 * not) and moves it to lace_ct once that settles it; returns it where it
 * is then. */
static __always_inline struct ct_val *ct_update(struct ct_key *k, struct ct_val *v, struct pkt *p, int from_origin)
{
	int settled = ct_settled(v->flags);
	ct_refresh(v, p, from_origin);
	if (!settled && ct_settled(v->flags))
		return ct_promote(k, v);
	return v;
}

/* ct_track_in records packet p arriving for the local pod at port ifindex
 * in network net_id from network src_net (a pod network, or the external
 * network a plain-IP source was classified into). It returns 0 with *out
 * the flow's entry when it was there before (NULL when p opened it, or is
 * an ICMP error, which updates nothing), or the drop reason.
 *
 * A live entry belongs to its peer network: a packet from another network
 * with the same tuple (overlapping subnets, or a forged source) neither
 * refreshes it, closes it nor takes it over, whatever its TCP flags: it
 * is refused (DROP_CT_OTHER_NET), as it could only be delivered as part
 * of a flow that is not its own. The key cannot carry the peer network
 * instead: the pod's side of a flow learns that network from the entry
 * (replies in an overlapping network's context).
 *
 * The pod's ingress policies decide every packet but a reply to a flow
 * the pod opened (policy.h), before anything is recorded: a refused
 * flow takes no entry. ifindex 0 (a constant) asks no policy: a path that
 * carries only replies. */
static __always_inline int ct_track_in(__u32 net_id, __u32 src_net, struct pkt *p, int icmp_err, __u32 ifindex,
				       struct ct_val **out)
{
	*out = NULL;
	if (icmp_err)
		return 0;
	struct ct_key k;
	ct_key_of(&k, net_id, p, 0);
	struct ct_val *v = ct_lookup(&k);
	if (v && v->peer_net != src_net)
		return DROP_CT_OTHER_NET;
	/* A SYN on a closing flow opens a new one (below): the other side's
	 * now, decided as any. */
	int reply = v && (v->flags & CT_ORIGIN_LOCAL) && !(is_tcp_syn(p) && ct_closing(v));
	if (ifindex && !reply && pol_denied(ifindex, POL_IN, src_net, p))
		return DROP_POLICY;
	if (v && !(is_tcp_syn(p) && ct_closing(v))) {
		*out = ct_update(&k, v, p, !(v->flags & CT_ORIGIN_LOCAL));
		return 0;
	}
	ct_create(&k, src_net, 0, 0, p, 1);
	return 0;
}

/* snat_exhausted counts a failed port pick toward sk's destination. */
static __always_inline void snat_exhausted(struct snat_key *sk)
{
	__u16 port = sk->port;
	sk->port = 0;
	struct snat_fail_val *f = bpf_map_lookup_elem(&lace_snat_exhausted, sk);
	if (f) {
		__sync_fetch_and_add(&f->count, 1);
		f->last = bpf_ktime_get_ns();
	} else {
		struct snat_fail_val nf = {.count = 1, .last = bpf_ktime_get_ns()};
		bpf_map_update_elem(&lace_snat_exhausted, sk, &nf, BPF_NOEXIST);
	}
	sk->port = port;
}

/* snat_same tells whether mapping a stands for the same pod flow as b
 * (its network, address and port); NULL a stands for none. */
static __always_inline int snat_same(const struct snat_val *a, const struct snat_val *b)
{
	return a && a->net_id == b->net_id && a->lport == b->lport && eq16(a->laddr, b->laddr);
}

/* snat_owner returns the live conntrack entry of the pod's flow the SNAT
 * mapping sk -> sv stands for (k receives its key), or NULL when that flow
 * is over: its entry expired, was evicted, or no longer holds this port.
 * A mapping lives exactly as long as its flow: replies are delivered only
 * while snat_owner finds it, and its port is free for another flow as soon
 * as it does not. */
static __always_inline struct ct_val *snat_owner(const struct snat_key *sk, const struct snat_val *sv, struct ct_key *k)
{
	int icmp = sk->proto == IPPROTO_ICMP || sk->proto == IPPROTO_ICMPV6;
	k->net_id = sv->net_id;
	k->family = sk->family;
	k->proto = sk->proto;
	k->pad = 0;
	k->lport = sv->lport;
	k->rport = icmp ? sv->lport : sk->rport;
	__builtin_memcpy(k->laddr, sv->laddr, 16);
	__builtin_memcpy(k->raddr, sk->raddr, 16);
	struct ct_val *v = ct_lookup(k);
	if (!v || !(v->flags & CT_SNAT) || v->snat_port != sk->port)
		return NULL;
	return v;
}

#endif
