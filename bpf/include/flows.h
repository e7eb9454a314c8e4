/* Flow events: what `lacectl flows` shows, from a ring buffer the agent
 * reads. Off unless someone listens: the agent sets lace_flow_cfg.on while
 * a client has asked for flows in the last minute, so a node nobody
 * watches pays one array lookup at each point that could tell. Bounded:
 * at most lace_flow_cfg.per_sec events a second on each CPU, the rest
 * counted as lost; a full ring drops events, never packets.
 *
 * Told: a pod's new flow as it leaves its node (forwarded), and every
 * packet a network policy refuses (dropped, with the policy). Other
 * drops are counted by reason (lace_drops), not told one by one. */
#ifndef LACE_FLOWS_H
#define LACE_FLOWS_H

#define FLOW_FORWARDED 1
#define FLOW_DROPPED 2

struct flow_cfg {
	__u32 on;
	__u32 per_sec;
};

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
	__u8 dir;      /* POL_IN or POL_OUT for a policy's decision */
	__u8 family;
	__u8 proto;
	__u8 tcp_flags;
	__u16 sport; /* network order */
	__u16 dport;
	__u16 pad;
	__u8 saddr[16];
	__u8 daddr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct flow_cfg);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_flow_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct flow_rate);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_flow_rate SEC(".maps");

/* flow_tell records packet p as a flow event: nets is the source network
 * in the high 16 bits and the destination's in the low (network IDs fit
 * 16 bits, as the SID carries them), what is verdict | reason << 8 |
 * dir << 16. A global function: verified once. */
__noinline int flow_tell(struct pkt *p, __u32 nets, __u32 ifindex, __u32 policy, __u32 what)
{
	if (!p)
		return 0;
	__u32 zero = 0;
	struct flow_cfg *cfg = bpf_map_lookup_elem(&lace_flow_cfg, &zero);
	if (!cfg || !cfg->on)
		return 0;
	struct flow_rate *r = bpf_map_lookup_elem(&lace_flow_rate, &zero);
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
	e->policy = policy;
	e->verdict = what;
	e->reason = what >> 8;
	e->dir = what >> 16;
	e->family = p->family;
	e->proto = p->proto;
	e->tcp_flags = p->tcp_flags;
	e->sport = p->sport;
	e->dport = p->dport;
	e->pad = 0;
	__builtin_memcpy(e->saddr, p->saddr, 16);
	__builtin_memcpy(e->daddr, p->daddr, 16);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* flow_nets packs two network IDs for flow_tell. */
static __always_inline __u32 flow_nets(__u32 src, __u32 dst)
{
	return (src << 16) | (dst & 0xffff);
}

#endif
