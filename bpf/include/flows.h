/* Flow events: what `lacectl flows` shows, from a ring buffer the agent
 * reads. Off unless someone listens: the agent sets lace_flow_cfg.on while
 * a client has asked for flows in the last minute, so a node nobody
 * watches pays one array lookup at each point that could tell. Bounded:
 * at most lace_flow_cfg.per_sec events a second on each CPU, the rest
 * counted as lost; a full ring drops events, never packets.
 *
 * Told: a pod's new flow as it leaves its node (forwarded, with the
 * Service frontend it addressed when it went through one), every packet
 * a network policy refuses (dropped, with the policy), and every other
 * packet a program drops or rejects (with the reason lace_drops counts
 * it under). drop() notes its reason in a per-CPU slot, and the program
 * tells the note as it ends (flow_drop_tell) when it dropped the packet
 * (TC_ACT_SHOT), or before it turns the packet into an ICMP error:
 * no drop site pays for telling, and the deepest call chains keep their
 * stack. A note is told only by the run that wrote it: every run that
 * drops calls drop(), which overwrites the slot, and the few that consume
 * a packet without dropping it clear it (consumed()).
 *
 * Two budgets: events about packets from the fabric (the underlay's
 * drops, which any host there can cause) never starve those about pods. */
#ifndef LACE_FLOWS_H
#define LACE_FLOWS_H

#define FLOW_FORWARDED 1
#define FLOW_DROPPED 2

struct flow_rate {
	__u64 window; /* the second being counted, in ns since boot / 1e9 */
	__u32 sent;
	__u32 lost;
};

struct flow_event {
	__u64 ts; /* ns since boot */
	__u32 src_net;
	__u32 dst_net;
	__u32 ifindex; /* the pod's port the decision was made at (0: none) */
	__u32 policy;  /* the refusing policy's id (dropped by policy) */
	__u8 verdict;  /* FLOW_FORWARDED or FLOW_DROPPED */
	__u8 reason;   /* the drop reason (enum drop_reason) */
	__u8 dir;      /* POL_OUT: the pod at ifindex sent it; POL_IN: it was for that pod */
	__u8 family;
	__u8 proto;
	__u8 tcp_flags;
	__u16 sport; /* network order */
	__u16 dport;
	__u16 svc_port; /* network order; 0: no Service frontend */
	__u8 saddr[16];
	__u8 daddr[16];
	__u8 svc_addr[16]; /* the frontend the pod addressed, before translation */
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct flow_rate);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_flow_rate SEC(".maps");

/* The budget of events about packets from the fabric (FLOW_FABRIC). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct flow_rate);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_flow_rate_fabric SEC(".maps");

/* A Service flow's translated conntrack key, built in flow_tell: a map
 * value, not its stack, which sits at the end of from_pod's deepest call
 * chain. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ct_key);
} lace_flow_key SEC(".maps");

/* flow_tell's what: verdict | reason << 8 | dir << 16 | flags | policy << 32. */
#define FLOW_SVC (1ULL << 24)	 /* a pod's flow through a Service, translated: name the frontend */
#define FLOW_FABRIC (1ULL << 25) /* about a packet from the fabric: its own budget */

/* flow_nets packs two network IDs for flow_tell. */
static __always_inline __u32 flow_nets(__u32 src, __u32 dst)
{
	return (src << 16) | (dst & 0xffff);
}

/* flow_tell records packet p as a flow event. nets is the source network
 * in the high 16 bits and the destination's in the low (network IDs fit
 * 16 bits, as the SID carries them), what as above. With FLOW_SVC, p is a
 * pod's flow through a Service as from_pod leaves it once translated,
 * from network nets >> 16: its conntrack entry (CT_DNAT) holds the
 * frontend the pod addressed. A global function: verified once, and its
 * lookups are paid only while someone listens. */
__noinline int flow_tell(struct pkt *p, __u32 nets, __u32 ifindex, __u64 what)
{
	if (!p)
		return 0;
	struct flow_cfg *cfg = bpf_map_lookup_elem(&lace_flow_cfg, &lace_zero_key);
	if (!cfg || !cfg->on)
		return 0;
	struct flow_rate *r = bpf_map_lookup_elem((what & FLOW_FABRIC) ? (void *)&lace_flow_rate_fabric : (void *)&lace_flow_rate,
						  &lace_zero_key);
	if (!r)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 sec = now / 1000000000ULL;
	if (r->window != sec) {
		r->window = sec;
		r->sent = 0;
	}
	if (r->sent >= cfg->per_sec) {
		r->lost++;
		return 0;
	}
	struct flow_event *e = bpf_ringbuf_reserve(&lace_flows, sizeof(*e), 0);
	if (!e) {
		r->lost++;
		return 0;
	}
	r->sent++;
	e->ts = now;
	e->src_net = nets >> 16;
	e->dst_net = nets & 0xffff;
	e->ifindex = ifindex;
	e->policy = what >> 32;
	e->verdict = what;
	e->reason = what >> 8;
	e->dir = what >> 16;
	e->family = p->family;
	e->proto = p->proto;
	e->tcp_flags = p->tcp_flags;
	e->sport = p->sport;
	e->dport = p->dport;
	__builtin_memcpy(e->saddr, p->saddr, 16);
	__builtin_memcpy(e->daddr, p->daddr, 16);
	e->svc_port = 0;
	__builtin_memset(e->svc_addr, 0, 16);
	struct ct_key *k = (what & FLOW_SVC) ? bpf_map_lookup_elem(&lace_flow_key, &lace_zero_key) : NULL;
	if (k) {
		ct_key_of(k, nets >> 16, p, 1);
		/* A new flow's entry is still pending (ct_insert). */
		struct ct_val *v = bpf_map_lookup_elem(&lace_ct, k);
		if (!v)
			v = bpf_map_lookup_elem(&lace_ct_local, k);
		if (v && (v->flags & CT_DNAT)) {
			e->svc_port = v->nat_port;
			__builtin_memcpy(e->svc_addr, v->nat_addr, 16);
		}
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* Where a program runs, for flow_drop_tell: which port is the pod's. */
#define FLOW_AT_POD_OUT 1 /* from_pod: the pod sent it (ingress_ifindex) */
#define FLOW_AT_POD_IN 2  /* to_pod: sent to the pod (ifindex) */
#define FLOW_AT_NODE 3    /* the underlay: no pod port */

/* flow_note_tell tells the drop this run noted for packet p, if it noted
 * one, and forgets the note. at says where the program runs, so which
 * port is the pod's and which way the packet went. A policy's drop was
 * told where it was decided, with the policy. */
__noinline int flow_note_tell(struct __sk_buff *skb, struct pkt *p, __u32 at)
{
	if (!skb || !p)
		return 0;
	__u32 *n = bpf_map_lookup_elem(&lace_drop_note, &lace_zero_key);
	if (!n || !*n)
		return 0;
	__u32 reason = *n - 1;
	*n = 0;
	if (reason == DROP_POLICY)
		return 0;
	/* Both read before choosing: a context field chosen by pointer
	 * arithmetic is refused by the verifier. */
	__u32 in_if = skb->ingress_ifindex, out_if = skb->ifindex;
	__u32 ifindex = at == FLOW_AT_POD_OUT ? in_if : at == FLOW_AT_POD_IN ? out_if : 0;
	__u64 what = FLOW_DROPPED | (reason << 8);
	__u32 nets = 0;
	if (at == FLOW_AT_NODE)
		what |= FLOW_FABRIC;
	else
		what |= (__u64)(at == FLOW_AT_POD_OUT ? POL_OUT : POL_IN) << 16;
	if (ifindex) {
		struct port_val *pv = bpf_map_lookup_elem(&lace_ports, &ifindex);
		if (pv)
			nets = at == FLOW_AT_POD_OUT ? flow_nets(pv->net_id, 0) : flow_nets(0, pv->net_id);
	}
	flow_tell(p, nets, ifindex, what);
	return 0;
}

/* flow_drop_tell tells the drop this run noted, if it dropped the packet
 * (rc TC_ACT_SHOT), with the packet as the skb holds it now (an SRv6
 * packet by its inner one), forgets the note either way, and returns rc,
 * the program's verdict. Called once, where each program ends: a global
 * function, so its frame never adds to a drop site's call chain, and
 * nothing of the program lives across it. A program that rewrites a
 * packet into an answer (an ICMP error) tells its drop before
 * (icmp_error, too_big_out). */
__noinline int flow_drop_tell(struct __sk_buff *skb, int rc, __u32 at)
{
	if (!skb)
		return rc;
	struct flow_cfg *cfg = bpf_map_lookup_elem(&lace_flow_cfg, &lace_zero_key);
	if (!cfg || !cfg->on)
		return rc;
	__u32 *n = bpf_map_lookup_elem(&lace_drop_note, &lace_zero_key);
	if (!n || !*n)
		return rc;
	if (rc != TC_ACT_SHOT) {
		*n = 0;
		return rc;
	}
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct pkt p = {};
	if ((void *)(eth + 1) > end || parse_ip(skb, eth->h_proto, ETH_HLEN, &p)) {
		*n = 0;
		return rc;
	}
	/* Lace's own encapsulation (a pod's packet dropped after it was
	 * encapsulated) or SRv6 from the fabric: the packet inside is the
	 * flow. The outer header's own next header, read again: a fragment's
	 * parse names what follows its fragment header. */
	__u8 nh = 0;
	if ((at == FLOW_AT_NODE || skb->mark == LACE_MARK_ENCAP) && p.family == LACE_FAMILY_V6 && !p.frag &&
	    !bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, nexthdr), &nh, 1) &&
	    (nh == IPPROTO_IPIP || nh == IPPROTO_IPV6)) {
		__builtin_memset(&p, 0, sizeof(p));
		if (parse_ip(skb, nh == IPPROTO_IPIP ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6), ETH_HLEN + sizeof(struct ipv6hdr), &p)) {
			*n = 0;
			return rc;
		}
	}
	flow_note_tell(skb, &p, at);
	return rc;
}

#endif
