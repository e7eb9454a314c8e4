/* Load balancing: the one frontend admission and the one endpoint pick
 * that every translation of a service uses, per packet (pod.c to_service,
 * underlay.c xlb_in) and at connect time (sock.c translate and
 * pod_hairpin). Written once so that a pod, the node and an outside
 * client are admitted by one rule and drawn by one rule: what differs
 * between the call sites on purpose is a flag below, with its reason.
 *
 * Neither function counts a drop: admission answers with the reason, and
 * each caller decides what a refusal means where it stands (a drop, a
 * refused connect, or only "leave it to from_pod"). */
#ifndef LACE_LB_H
#define LACE_LB_H

#include "lace.h"
#include "ct.h"
#include "frontend.h"

/* lb_admit flags. */
/* The client is in the cluster (a pod, the node's own sockets): at a
 * frontend of an externalTrafficPolicy Local service it is served by the
 * ClusterIP's endpoints, as kube-proxy serves in-cluster clients. An
 * outside client (xlb_in) keeps the frontend's, the node-local ones. */
#define LB_IN_CLUSTER 1
/* The caller has already looked the VIP up in the client's view and found
 * a service route there (from_pod, per packet), to network route_net: a
 * ClusterIP needs no second lookup, only that network to be the
 * service's (a VIP handed from one network's service to another's is
 * written to lace_services before the views change: for that while, the
 * old view's route must not admit the new service). Without it, a
 * ClusterIP is admitted when the view reaches it as a service of its
 * network (reaches_service). */
#define LB_VIEW_CHECKED 2

/* lb_admit decides whether a client may use service entry *svp (a
 * ClusterIP, or an external frontend: NodePort, LoadBalancer, ExternalIP,
 * hostPort). The client is judged by the view of view_net (its network,
 * its external network, or the node's) and, for loadBalancerSourceRanges,
 * by its address saddr; vip is the address it addressed (route_net: see
 * LB_VIEW_CHECKED; 0 without it). A frontend is
 * admitted as its service's ClusterIP would be (frontend_admits), in this
 * order: closed, cluster reference and reach, source ranges, then
 * externalTrafficPolicy Local (LB_IN_CLUSTER), which points *svp at the
 * ClusterIP's own entry. Returns 0 when admitted, else the drop reason:
 * DROP_FRONTEND_CLOSED, DROP_ISOLATED, DROP_SOURCE_RANGE, or
 * DROP_NO_SERVICE_PORT when a Local service's ClusterIP entry is missing
 * (as if there were no service at all). */
static __always_inline int lb_admit(struct svc_val **svp, __u32 view_net, __u8 family, __u8 proto, const __u8 *vip,
				    const __u8 *saddr, int flags, __u32 route_net)
{
	struct svc_val *sv = *svp;
	if (!(sv->flags & SVC_EXTERNAL)) {
		if (flags & LB_VIEW_CHECKED)
			return route_net == sv->net_id ? 0 : DROP_ISOLATED;
		if (!reaches_service(view_net, family, vip, sv->net_id))
			return DROP_ISOLATED;
		return 0;
	}
	if (sv->flags & SVC_CLOSED)
		return DROP_FRONTEND_CLOSED;
	struct backend_val *ref = cluster_ref(sv->id);
	if (!ref || !frontend_admits(view_net, family, sv->flags, ref->addr, sv->net_id))
		return DROP_ISOLATED;
	if ((sv->flags & SVC_SRC_RANGES) && !source_admitted(sv->id, family, saddr))
		return DROP_SOURCE_RANGE;
	if ((flags & LB_IN_CLUSTER) && (sv->flags & SVC_LOCAL)) {
		sv = cluster_service(family, proto, ref);
		if (!sv)
			return DROP_NO_SERVICE_PORT;
		*svp = sv;
	}
	return 0;
}

/* lb_no_endpoint is the reason a service without endpoints here refuses
 * a new flow, or 0 when it has some: SVC_DROP (internalTrafficPolicy or
 * externalTrafficPolicy Local, none on this node) drops; otherwise it is
 * rejected (the callers answer ICMP port unreachable or ECONNREFUSED on
 * DROP_NO_BACKEND). */
static __always_inline int lb_no_endpoint(const struct svc_val *sv)
{
	if (sv->count)
		return 0;
	return sv->flags & SVC_DROP ? DROP_NO_LOCAL_BACKEND : DROP_NO_BACKEND;
}

/* lb_flow_hash is the draw of the flow of p: SipHash-2-4 of its tuple as
 * the client sent it, so that every packet of a flow draws alike. A flow
 * whose conntrack entry is lost before its next packet (a flood evicting
 * it from lace_ct_new between the SYN and the handshake's last ACK) is
 * drawn again to the endpoint it had, as long as the service's endpoints
 * are the same, where a random draw would send that ACK to another
 * endpoint, which resets the connection. Keyed by lace_config.flow_key,
 * 128 bits drawn once per node: SipHash is a PRF, so what a tenant sees of
 * its draws (which of its endpoints, which node port) tells nothing of the
 * key, and it cannot choose another tenant's endpoint by choosing source
 * ports. */
static __always_inline __u64 lb_rotl(__u64 x, int b)
{
	return (x << b) | (x >> (64 - b));
}

#define LB_SIPROUND                                                                                                    \
	do {                                                                                                           \
		v0 += v1;                                                                                              \
		v1 = lb_rotl(v1, 13);                                                                                  \
		v1 ^= v0;                                                                                              \
		v0 = lb_rotl(v0, 32);                                                                                  \
		v2 += v3;                                                                                              \
		v3 = lb_rotl(v3, 16);                                                                                  \
		v3 ^= v2;                                                                                              \
		v0 += v3;                                                                                              \
		v3 = lb_rotl(v3, 21);                                                                                  \
		v3 ^= v0;                                                                                              \
		v2 += v1;                                                                                              \
		v1 = lb_rotl(v1, 17);                                                                                  \
		v1 ^= v2;                                                                                              \
		v2 = lb_rotl(v2, 32);                                                                                  \
	} while (0)

/* A global function: the verifier checks it once, on its own, rather than
 * at every call on every path (as a static one, it doubled
 * from_underlay's verified instructions); and its frame is its own, where
 * inlined its temporaries grew to_service's and xlb_in's frames past the
 * 512 bytes of the deepest call chain. Unused by sock.c, which draws at
 * random. The message is the 38 bytes saddr, daddr, sport, dport, family,
 * proto (the ports in network order, as carried), read as SipHash's
 * little-endian words; a node without its key yet (no SetConfig) hashes
 * with key 0. */
__attribute__((noinline)) __u64 lb_flow_hash(const struct pkt *p)
{
	if (!p)
		return 0;
	struct lace_config *cfg = config();
	__u64 k0 = cfg ? cfg->flow_key[0] : 0, k1 = cfg ? cfg->flow_key[1] : 0;
	__u64 v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
	__u64 v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
	/* struct pkt keeps its addresses 4-byte aligned: words of 32 bits
	 * (the verifier refuses a misaligned 64-bit stack read). A loop, not
	 * unrolled: unrolled, clang loads every word first and spills them. */
	const __u32 *w = (const __u32 *)p->saddr;
#pragma clang loop unroll(disable)
	for (int i = 0; i < 8; i += 2) {
		__u64 m = (__u64)w[i] | ((__u64)w[i + 1] << 32);
		v3 ^= m;
		LB_SIPROUND;
		LB_SIPROUND;
		v0 ^= m;
	}
	__u64 m = (__u64)p->sport | ((__u64)p->dport << 16) | ((__u64)p->family << 32) | ((__u64)p->proto << 40) |
		  (38ULL << 56);
	v3 ^= m;
	LB_SIPROUND;
	LB_SIPROUND;
	v0 ^= m;
	v2 ^= 0xff;
	LB_SIPROUND;
	LB_SIPROUND;
	LB_SIPROUND;
	LB_SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

/* lb_pick modes: what the pick does about the client's own address self
 * as an endpoint. Both are pod_hairpin's bargain with from_pod: a pod's
 * TCP socket gets its 1/n chance at itself at connect time (sock.c), so
 * the per-packet pick must not give it a second one. */
#define LB_ANY 0
/* pod_hairpin: only the client itself is an answer; any other endpoint
 * (drawn, or remembered by affinity) is left to from_pod untouched: no
 * affinity is written or renewed. */
#define LB_ONLY_SELF 1
/* to_service for a pod whose sockets pass the socket hooks: a fresh draw
 * of the client itself is drawn again among the n-1 others (each then
 * 1/n overall). Affinity to itself stands. */
#define LB_NOT_SELF 2

/* lb_pick chooses the endpoint of a new flow of client (16 bytes) to
 * service sv (its endpoints are lace_backends (id, 0..count-1)) into
 * be_addr and be_port: the client's ClientIP affinity while it lasts
 * (renewed), else the endpoint draw picks (lb_flow_hash per packet, a
 * random number at connect time), remembered when the service has
 * affinity (seconds). ak and av are the caller's room for the affinity key
 * and value (the stack, or a per-CPU scratch where the stack is tight).
 * sv->count must not be 0 (lb_no_endpoint first). Returns 0, or -1 when there is no endpoint to take
 * (a backend missing at the drawn index, or in LB_ONLY_SELF mode another
 * endpoint than the client). */
static __always_inline int lb_pick(const struct svc_val *sv, __u8 family, const __u8 *client, const __u8 *self, int mode,
				   __u32 draw, struct affinity_key *ak, struct affinity_val *av, __u8 *be_addr, __u16 *be_port)
{
	/* Read from sv where used, not held in registers across the helper
	 * calls: xlb_in's frame is at the edge of from_underlay's 512-byte
	 * stack and a spill would cross it. */
	__u32 id = sv->id, n = sv->count;
	__builtin_memset(ak, 0, sizeof(*ak));
	ak->id = id;
	ak->family = family;
	__builtin_memcpy(ak->client, client, 16);
	struct affinity_val *af = sv->affinity ? bpf_map_lookup_elem(&lace_affinity, ak) : NULL;
	__u64 now = bpf_ktime_get_ns();
	if (af && af->expires > now) {
		if (mode == LB_ONLY_SELF && !eq16(af->addr, self))
			return -1;
		__builtin_memcpy(be_addr, af->addr, 16);
		*be_port = af->port;
		af->expires = now + (__u64)sv->affinity * NSEC;
		return 0;
	}
	__u32 r = draw % n;
	struct backend_key bk = {.id = id, .index = r};
	struct backend_val *be = bpf_map_lookup_elem(&lace_backends, &bk);
	if (be && mode == LB_NOT_SELF && n > 1 && eq16(be->addr, self)) {
		__u32 r2 = (draw / n) % (n - 1);
		bk.index = r2 >= r ? r2 + 1 : r2;
		be = bpf_map_lookup_elem(&lace_backends, &bk);
	}
	if (!be)
		return -1;
	if (mode == LB_ONLY_SELF && !eq16(be->addr, self))
		return -1;
	__builtin_memcpy(be_addr, be->addr, 16);
	*be_port = be->port;
	if (sv->affinity) {
		__builtin_memset(av, 0, sizeof(*av));
		av->expires = now + (__u64)sv->affinity * NSEC;
		av->port = be->port;
		__builtin_memcpy(av->addr, be->addr, 16);
		bpf_map_update_elem(&lace_affinity, ak, av, BPF_ANY);
	}
	return 0;
}

#endif
