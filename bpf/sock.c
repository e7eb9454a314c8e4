//go:build ignore

/* Connect-time service translation for the node's own sockets (cgroup
 * sock_addr hooks): node processes and host-network pods reach ClusterIPs
 * although their packets never cross a pod's veth. A connect (TCP, UDP)
 * or an unconnected sendmsg to a VIP and service port is pointed at one
 * of the service's endpoints before any packet exists; recvmsg turns an
 * endpoint's datagram back into the VIP's. The programs act only on
 * sockets of the node's host network namespace (its cookie is in
 * lace_config): pods' sockets in the same cgroup tree are left to the
 * veth programs, and a cgroup hook never acts outside the node it serves.
 *
 * Who may reach a VIP follows section 5: the node is an outside host
 * classified by its address, so the VIP must be in the view of that
 * network (the shipped world -> default opens the default network's
 * services). Refusals answer EPERM, the only error these hooks can give. */
#include "lace.h"

#define SOCK_STREAM 1
#define SOCK_DGRAM 2

/* Reverse translation per socket: an endpoint's address and port -> the
 * VIP and port the socket addressed. */
struct sock_rnat_key {
	__u64 cookie;
	__u8 family;
	__u8 pad;
	__u16 port;
	__u32 pad2;
	__u8 addr[16];
};

struct sock_rnat_val {
	__u8 vip[16];
	__u16 port;
	__u16 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_rnat_key);
	__type(value, struct sock_rnat_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_sock_rnat SEC(".maps");


/* translate points addr:port (a VIP and service port, 16 bytes and
 * network order) at an endpoint, in place. 1: go on (translated or not a
 * service); 0: refuse. */
static __always_inline int translate(struct bpf_sock_addr *ctx, __u8 family, __u8 *addr, __u16 *port)
{
	struct lace_config *cfg = config();
	if (!cfg || !cfg->host_netns || bpf_get_netns_cookie(ctx) != cfg->host_netns)
		return 1;
	__u8 proto;
	if (ctx->type == SOCK_STREAM)
		proto = IPPROTO_TCP;
	else if (ctx->type == SOCK_DGRAM)
		proto = IPPROTO_UDP;
	else
		return 1;
	struct svc_key sk = {.family = family, .proto = proto, .port = *port};
	__builtin_memcpy(sk.vip, addr, 16);
	struct svc_val *sv = bpf_map_lookup_elem(&lace_services, &sk);
	if (!sv)
		return 1;
	__u32 view = family == LACE_FAMILY_V4 ? cfg->host_net4 : cfg->host_net6;
	struct route_key rk = {.prefixlen = 64 + 128, .net_id = view, .family = family};
	__builtin_memcpy(rk.addr, addr, 16);
	struct route_val *rv = view ? bpf_map_lookup_elem(&lace_routes, &rk) : NULL;
	if (!rv || !(rv->flags & ROUTE_SERVICE) || rv->dst_net != sv->net_id) {
		drop(DROP_ISOLATED);
		return 0;
	}
	__u32 n = sv->count, id = sv->id, affinity = sv->affinity;
	if (n == 0) {
		drop((sv->flags & SVC_DROP) ? DROP_NO_LOCAL_BACKEND : DROP_NO_BACKEND);
		return 0;
	}
	__u8 be_addr[16];
	__u16 be_port;
	struct affinity_key ak = {.id = id, .family = family};
	if (family == LACE_FAMILY_V4)
		__builtin_memcpy(ak.client, cfg->underlay_ip4, 4);
	else
		__builtin_memcpy(ak.client, cfg->underlay_ip6, 16);
	struct affinity_val *af = affinity ? bpf_map_lookup_elem(&lace_affinity, &ak) : NULL;
	__u64 now = bpf_ktime_get_ns();
	if (af && af->expires > now) {
		__builtin_memcpy(be_addr, af->addr, 16);
		be_port = af->port;
		af->expires = now + (__u64)affinity * 1000000000ULL;
	} else {
		struct backend_key bk = {.id = id, .index = bpf_get_prandom_u32() % n};
		struct backend_val *be = bpf_map_lookup_elem(&lace_backends, &bk);
		if (!be)
			return 0;
		__builtin_memcpy(be_addr, be->addr, 16);
		be_port = be->port;
		if (affinity) {
			struct affinity_val nv = {.expires = now + (__u64)affinity * 1000000000ULL, .port = be_port};
			__builtin_memcpy(nv.addr, be_addr, 16);
			bpf_map_update_elem(&lace_affinity, &ak, &nv, BPF_ANY);
		}
	}
	struct sock_rnat_key rnk = {.cookie = bpf_get_socket_cookie(ctx), .family = family, .port = be_port};
	__builtin_memcpy(rnk.addr, be_addr, 16);
	struct sock_rnat_val rnv = {.port = *port};
	__builtin_memcpy(rnv.vip, addr, 16);
	bpf_map_update_elem(&lace_sock_rnat, &rnk, &rnv, BPF_ANY);
	count(FWD_SERVICE);
	__builtin_memcpy(addr, be_addr, 16);
	*port = be_port;
	return 1;
}

static __always_inline int to4(struct bpf_sock_addr *ctx)
{
	__u8 addr[16] = {};
	__u32 ip = ctx->user_ip4;
	__builtin_memcpy(addr, &ip, 4);
	__u16 port = (__u16)ctx->user_port;
	if (!translate(ctx, LACE_FAMILY_V4, addr, &port))
		return 0;
	__builtin_memcpy(&ip, addr, 4);
	ctx->user_ip4 = ip;
	ctx->user_port = port;
	return 1;
}

/* is_mapped tells whether an IPv6 address is IPv4-mapped (::ffff:a.b.c.d),
 * which dual-stack sockets use for IPv4 peers. */
static __always_inline int is_mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
}

static __always_inline int to6(struct bpf_sock_addr *ctx)
{
	__u32 a[4];
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	__u16 port = (__u16)ctx->user_port;
	if (is_mapped(a)) {
		__u8 addr[16] = {};
		__builtin_memcpy(addr, &a[3], 4);
		if (!translate(ctx, LACE_FAMILY_V4, addr, &port))
			return 0;
		__builtin_memcpy(&a[3], addr, 4);
		ctx->user_ip6[3] = a[3];
		ctx->user_port = port;
		return 1;
	}
	if (!translate(ctx, LACE_FAMILY_V6, (__u8 *)a, &port))
		return 0;
	ctx->user_ip6[0] = a[0];
	ctx->user_ip6[1] = a[1];
	ctx->user_ip6[2] = a[2];
	ctx->user_ip6[3] = a[3];
	ctx->user_port = port;
	return 1;
}

/* from_endpoint rewrites the source of a datagram an endpoint sent to a
 * translated socket back to the VIP it addressed. */
static __always_inline void from_endpoint(struct bpf_sock_addr *ctx, __u8 family, __u8 *addr, int mapped)
{
	struct lace_config *cfg = config();
	if (!cfg || !cfg->host_netns || bpf_get_netns_cookie(ctx) != cfg->host_netns)
		return;
	struct sock_rnat_key k = {.cookie = bpf_get_socket_cookie(ctx), .family = family, .port = (__u16)ctx->user_port};
	__builtin_memcpy(k.addr, addr, 16);
	struct sock_rnat_val *v = bpf_map_lookup_elem(&lace_sock_rnat, &k);
	if (!v)
		return;
	if (mapped) {
		__u32 ip;
		__builtin_memcpy(&ip, v->vip, 4);
		ctx->user_ip6[3] = ip;
	} else if (family == LACE_FAMILY_V4) {
		__u32 ip;
		__builtin_memcpy(&ip, v->vip, 4);
		ctx->user_ip4 = ip;
	} else {
		__u32 a[4];
		__builtin_memcpy(a, v->vip, 16);
		ctx->user_ip6[0] = a[0];
		ctx->user_ip6[1] = a[1];
		ctx->user_ip6[2] = a[2];
		ctx->user_ip6[3] = a[3];
	}
	ctx->user_port = v->port;
}

SEC("cgroup/connect4")
int sock_connect4(struct bpf_sock_addr *ctx) { return to4(ctx); }

SEC("cgroup/connect6")
int sock_connect6(struct bpf_sock_addr *ctx) { return to6(ctx); }

SEC("cgroup/sendmsg4")
int sock_sendmsg4(struct bpf_sock_addr *ctx) { return to4(ctx); }

SEC("cgroup/sendmsg6")
int sock_sendmsg6(struct bpf_sock_addr *ctx) { return to6(ctx); }

SEC("cgroup/recvmsg4")
int sock_recvmsg4(struct bpf_sock_addr *ctx)
{
	__u8 addr[16] = {};
	__u32 ip = ctx->user_ip4;
	__builtin_memcpy(addr, &ip, 4);
	from_endpoint(ctx, LACE_FAMILY_V4, addr, 0);
	return 1;
}

SEC("cgroup/recvmsg6")
int sock_recvmsg6(struct bpf_sock_addr *ctx)
{
	__u32 a[4];
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	if (is_mapped(a)) {
		__u8 addr[16] = {};
		__builtin_memcpy(addr, &a[3], 4);
		from_endpoint(ctx, LACE_FAMILY_V4, addr, 1);
		return 1;
	}
	from_endpoint(ctx, LACE_FAMILY_V6, (__u8 *)a, 0);
	return 1;
}

char __license[] SEC("license") = "GPL";
