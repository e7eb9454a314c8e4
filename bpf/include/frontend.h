/* External frontends of services (NodePort on the node's addresses,
 * LoadBalancer ingress addresses, ExternalIPs): the lookups the pod,
 * underlay and socket programs share. A frontend is an entry of
 * lace_services with SVC_EXTERNAL; what it admits follows from the
 * service's ClusterIP (BACKEND_CLUSTER_REF), so no client reaches a
 * service through a frontend that its ClusterIP would refuse it. */
#ifndef LACE_FRONTEND_H
#define LACE_FRONTEND_H

#include "lace.h"

/* is_loopback tells whether addr is 127.0.0.0/8 or ::1. */
static __always_inline int is_loopback(__u8 family, const __u8 *addr)
{
	if (family == LACE_FAMILY_V4)
		return addr[0] == 127;
	const __u32 *a = (const __u32 *)addr;
	return a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == bpf_htonl(1);
}

/* frontend returns the external frontend at addr, proto and port
 * (network order), or NULL. */
static __always_inline struct svc_val *frontend(__u8 family, __u8 proto, __u16 port, const __u8 *addr)
{
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return NULL;
	/* A loopback frontend (a hostPort with hostIP 127.0.0.1) is the
	 * node's own sockets' (sock.c): a packet carrying a loopback
	 * destination over a wire or a veth is forged, never let in. */
	if (is_loopback(family, addr))
		return NULL;
	struct svc_key sk = {.family = family, .proto = proto, .port = port};
	__builtin_memcpy(sk.vip, addr, 16);
	struct svc_val *sv = bpf_map_lookup_elem(&lace_services, &sk);
	if (!sv || !(sv->flags & SVC_EXTERNAL))
		return NULL;
	return sv;
}

/* cluster_ref is the ClusterIP and port of frontend id's service. */
static __always_inline struct backend_val *cluster_ref(__u32 id)
{
	struct backend_key bk = {.id = id, .index = BACKEND_CLUSTER_REF};
	return bpf_map_lookup_elem(&lace_backends, &bk);
}

/* reaches_service tells whether the view of view_net holds the ClusterIP
 * ref as a service of network net: the one admission rule of a frontend,
 * for outside sources (their external network), pods and the node. */
static __always_inline int reaches_service(__u32 view_net, __u8 family, const __u8 *cluster_ip, __u32 net)
{
	if (!view_net)
		return 0;
	struct route_key rk = {.prefixlen = 64 + 128, .net_id = view_net, .family = family};
	__builtin_memcpy(rk.addr, cluster_ip, 16);
	struct route_val *rv = bpf_map_lookup_elem(&lace_routes, &rk);
	return rv && (rv->flags & ROUTE_SERVICE) && rv->dst_net == net;
}

/* frontend_admits is the admission of frontend sv (flags, network net,
 * ref its BACKEND_CLUSTER_REF) for a source judged by the view of
 * view_net: a service's frontend when the view reaches its ClusterIP as a
 * service of its network, a pod's hostPort when the view routes the pod's
 * address into the pod's network as a block of this node (a view that
 * reaches the pod; neither denied nor closed). One rule for outside
 * sources, pods and the node. */
static __always_inline int frontend_admits(__u32 view_net, __u8 family, __u16 flags, const __u8 *ref, __u32 net)
{
	if (!view_net)
		return 0;
	struct route_key rk = {.prefixlen = 64 + 128, .net_id = view_net, .family = family};
	__builtin_memcpy(rk.addr, ref, 16);
	struct route_val *rv = bpf_map_lookup_elem(&lace_routes, &rk);
	if (!rv || rv->dst_net != net)
		return 0;
	if (((flags >> SVC_KIND_SHIFT) & SVC_KIND_MASK) == SVC_KIND_HOSTPORT)
		return (rv->flags & (ROUTE_LOCAL | ROUTE_SUBNET | ROUTE_EXTERNAL | ROUTE_DENY | ROUTE_CLOSED | ROUTE_SERVICE)) ==
		       ROUTE_LOCAL;
	return (rv->flags & ROUTE_SERVICE) != 0;
}

/* cluster_service is the ClusterIP's own entry of a frontend's service:
 * in-cluster clients of an externalTrafficPolicy Local service reach all
 * its endpoints, as kube-proxy's do. */
static __always_inline struct svc_val *cluster_service(__u8 family, __u8 proto, struct backend_val *ref)
{
	struct svc_key sk = {.family = family, .proto = proto, .port = ref->port};
	__builtin_memcpy(sk.vip, ref->addr, 16);
	struct svc_val *sv = bpf_map_lookup_elem(&lace_services, &sk);
	if (!sv || (sv->flags & SVC_EXTERNAL))
		return NULL;
	return sv;
}

/* source_admitted checks a client address against the frontend's
 * loadBalancerSourceRanges. */
static __always_inline int source_admitted(__u32 id, __u8 family, const __u8 *saddr)
{
	struct src_range_key k = {.prefixlen = 64 + 128, .id = id, .family = family};
	__builtin_memcpy(k.addr, saddr, 16);
	return bpf_map_lookup_elem(&lace_src_ranges, &k) != NULL;
}

#endif
