//go:build ignore

/* Connect-time service translation for the node's own sockets (cgroup
 * sock_addr hooks): node processes and host-network pods reach ClusterIPs
 * although their packets never cross a pod's veth. A connect (TCP, UDP)
 * or an unconnected sendmsg to a VIP and service port is pointed at one
 * of the service's endpoints before any packet exists; recvmsg turns an
 * endpoint's datagram back into the VIP's, getpeername shows the VIP.
 * The programs translate sockets of the node's host network namespace
 * (its cookie is in lace_config); of a pod's sockets (its namespace's
 * cookie is in lace_pod_netns) they take only the hairpin choice
 * (pod_hairpin), the rest is the veth programs'. Any other socket in the
 * cgroup tree is left alone: a hook never acts outside the node it
 * serves.
 *
 * External IPs are never translated for the node's sockets: they are
 * Service authors' claims on addresses, and the node keeps reaching the
 * real ones. Pods reach an admitted external IP per packet (from_pod).
 *
 * Who may reach a VIP follows docs/external-networks.md: the node is an
 * outside host classified by its address, so the VIP must be in the view
 * of that network (the shipped world -> default opens the default
 * network's services). A service without endpoints answers ECONNREFUSED
 * (the ICMP port unreachable per packet); other refusals EPERM. */
#include "lace.h"
#include "ct.h"
#include "lb.h"

#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define ECONNREFUSED_ 111 /* errno.h drags in libc */

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


/* remember_vip records that the socket's endpoint addr:port stands for
 * the VIP and port it addressed (recvmsg, getpeername). */
static __always_inline void remember_vip(struct bpf_sock_addr *ctx, __u8 family, const __u8 *be_addr, __u16 be_port,
					 const __u8 *vip, __u16 vport)
{
	struct sock_rnat_key rnk = {.cookie = bpf_get_socket_cookie(ctx), .family = family, .port = be_port};
	__builtin_memcpy(rnk.addr, be_addr, 16);
	struct sock_rnat_val rnv = {.port = vport};
	__builtin_memcpy(rnv.vip, vip, 16);
	bpf_map_update_elem(&lace_sock_rnat, &rnk, &rnv, BPF_ANY);
}

/* sock_pick points the socket's addr:port (a VIP and service port) at
 * the endpoint lb_pick chooses for client self, and remembers the VIP for
 * recvmsg and getpeername: 0, or -1 when there is none to take (nothing
 * changed). */
static __always_inline int sock_pick(struct bpf_sock_addr *ctx, struct svc_val *sv, __u8 family, const __u8 *self, int mode,
				     __u8 *addr, __u16 *port)
{
	__u8 be_addr[16];
	__u16 be_port;
	struct affinity_key ak;
	struct affinity_val av;
	if (lb_pick(sv, family, self, self, mode, bpf_get_prandom_u32(), &ak, &av, be_addr, &be_port))
		return -1;
	remember_vip(ctx, family, be_addr, be_port, addr, *port);
	count(FWD_SERVICE);
	__builtin_memcpy(addr, be_addr, 16);
	*port = be_port;
	return 0;
}

/* pod_hairpin takes the one choice a pod's own socket must make before
 * any packet exists: itself as the service's endpoint. Per packet, a
 * pod's flow to its own address could never come back out of it (its
 * answers are delivered inside the pod), so the socket is pointed at the
 * pod's own address and the connection stays inside the pod: the server
 * sees the pod's own address as the client (kube-proxy shows the node's),
 * getpeername and recvmsg still show the VIP. Everything else (another
 * endpoint, refusals, drops, views) is left to from_pod, which then
 * picks among the other endpoints (PORT_SOCK_LB) so that every endpoint
 * keeps its 1/n; affinity is honoured as per packet. TCP only: a UDP
 * socket connected to the pod itself could not be moved when the pod
 * leaves the endpoints (the stale-flow flush acts on map entries), so UDP
 * hairpins per packet, from the VIP. Only in the service's own network:
 * elsewhere the pod's address may be another pod's. */
static __always_inline int pod_hairpin(struct bpf_sock_addr *ctx, __u64 netns, __u8 family, __u8 *addr, __u16 *port)
{
	/* A pod's loopback is its own: a node's loopback hostPort is not. */
	if (is_loopback(family, addr))
		return 1;
	__u32 *ifindex = bpf_map_lookup_elem(&lace_pod_netns, &netns);
	if (!ifindex)
		return 1;
	__u32 ifi = *ifindex;
	struct port_val *pv = bpf_map_lookup_elem(&lace_ports, &ifi);
	if (!pv)
		return 1;
	__u8 self[16] = {};
	if (family == LACE_FAMILY_V4) {
		if (!(pv->flags & PORT_HAS_V4))
			return 1;
		__builtin_memcpy(self, pv->ip4, 4);
	} else {
		if (!(pv->flags & PORT_HAS_V6))
			return 1;
		__builtin_memcpy(self, pv->ip6, 16);
	}
	__u32 net_id = pv->net_id;
	struct svc_key sk = {.family = family, .proto = IPPROTO_TCP, .port = *port};
	__builtin_memcpy(sk.vip, addr, 16);
	struct svc_val *sv = bpf_map_lookup_elem(&lace_services, &sk);
	if (!sv)
		return 1;
	/* A frontend of the service is admitted as its ClusterIP; refusals
	 * are from_pod's to count. A frontend with loadBalancerSourceRanges
	 * is left to from_pod whatever the pod's address, as it always was
	 * (so a pod the ranges admit never draws itself there: from_pod
	 * draws among the others). */
	if ((sv->flags & SVC_EXTERNAL) && (sv->flags & SVC_SRC_RANGES))
		return 1;
	if (lb_admit(&sv, net_id, family, IPPROTO_TCP, addr, self, LB_IN_CLUSTER, 0))
		return 1;
	if (sv->count == 0 || sv->net_id != net_id)
		return 1;
	sock_pick(ctx, sv, family, self, LB_ONLY_SELF, addr, port);
	return 1;
}

/* translate points addr:port (a VIP and service port, 16 bytes and
 * network order) at an endpoint, in place. 1: go on (translated or not a
 * service); 0: refuse. */
static __always_inline int translate(struct bpf_sock_addr *ctx, __u8 family, __u8 *addr, __u16 *port)
{
	struct lace_config *cfg = config();
	if (!cfg || !cfg->host_netns)
		return 1;
	__u8 proto;
	if (ctx->type == SOCK_STREAM)
		proto = IPPROTO_TCP;
	else if (ctx->type == SOCK_DGRAM)
		proto = IPPROTO_UDP;
	else
		return 1;
	__u64 netns = bpf_get_netns_cookie(ctx);
	if (netns != cfg->host_netns)
		return proto == IPPROTO_TCP ? pod_hairpin(ctx, netns, family, addr, port) : 1;
	struct svc_key sk = {.family = family, .proto = proto, .port = *port};
	__builtin_memcpy(sk.vip, addr, 16);
	struct svc_val *sv = bpf_map_lookup_elem(&lace_services, &sk);
	if (!sv)
		return 1;
	/* An external IP is a Service author's claim on an address; the
	 * node's own processes (kubelet, the agent, host-network pods) keep
	 * reaching the real one (CVE-2020-8554): never translated here. */
	if ((sv->flags & SVC_EXTERNAL) && ((sv->flags >> SVC_KIND_SHIFT) & SVC_KIND_MASK) == SVC_KIND_EXTERNAL_IP)
		return 1;
	__u32 view = family == LACE_FAMILY_V4 ? cfg->host_net4 : cfg->host_net6;
	/* The node is the client: its underlay address is judged by the
	 * source ranges and keys its affinity. */
	__u8 self[16] = {};
	if (family == LACE_FAMILY_V4)
		__builtin_memcpy(self, cfg->underlay_ip4, 4);
	else
		__builtin_memcpy(self, cfg->underlay_ip6, 16);
	int why = lb_admit(&sv, view, family, proto, addr, self, LB_IN_CLUSTER, 0);
	/* A Local frontend whose ClusterIP entry is missing is no service
	 * here, as a VIP without an entry: the connect goes on untouched. */
	if (why == DROP_NO_SERVICE_PORT)
		return 1;
	if (why) {
		drop(why);
		return 0;
	}
	why = lb_no_endpoint(sv);
	if (why) {
		drop(why);
		/* Rejected, as kube-proxy's ICMP port unreachable is: the
		 * caller sees connection refused at once. */
		if (why == DROP_NO_BACKEND)
			bpf_set_retval(-ECONNREFUSED_);
		return 0;
	}
	return sock_pick(ctx, sv, family, self, LB_ANY, addr, port) ? 0 : 1;
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
 * translated socket (or its peer's address) back to the VIP it
 * addressed. Only sockets the hooks translated have entries (by cookie). */
static __always_inline void from_endpoint(struct bpf_sock_addr *ctx, __u8 family, __u8 *addr, int mapped)
{
	/* Sockets the hooks may have translated: the node's and pods'. The
	 * rest of the cgroup tree pays one lookup, not a hash per call. */
	struct lace_config *cfg = config();
	if (!cfg || !cfg->host_netns)
		return;
	__u64 netns = bpf_get_netns_cookie(ctx);
	if (netns != cfg->host_netns && !bpf_map_lookup_elem(&lace_pod_netns, &netns))
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

static __always_inline int back4(struct bpf_sock_addr *ctx)
{
	__u8 addr[16] = {};
	__u32 ip = ctx->user_ip4;
	__builtin_memcpy(addr, &ip, 4);
	from_endpoint(ctx, LACE_FAMILY_V4, addr, 0);
	return 1;
}

static __always_inline int back6(struct bpf_sock_addr *ctx)
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

SEC("cgroup/recvmsg4")
int sock_recvmsg4(struct bpf_sock_addr *ctx) { return back4(ctx); }

SEC("cgroup/recvmsg6")
int sock_recvmsg6(struct bpf_sock_addr *ctx) { return back6(ctx); }

SEC("cgroup/getpeername4")
int sock_getpeername4(struct bpf_sock_addr *ctx) { return back4(ctx); }

SEC("cgroup/getpeername6")
int sock_getpeername6(struct bpf_sock_addr *ctx) { return back6(ctx); }

char __license[] SEC("license") = "GPL";
