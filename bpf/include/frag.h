/* IP fragments through translation (both families).
 *
 * A datagram larger than the MTU leaves its sender in fragments: only the
 * first carries the L4 header (ports); the later ones carry payload where
 * the header would be. Every path that looks a flow up by its ports (the
 * view and conntrack, services, SNAT, external frontends, the answers of
 * each) would otherwise see a later fragment as another flow with ports 0,
 * and leave it untranslated. As Cilium's fragment map (IPV4_FRAG_DATAGRAMS_MAP,
 * ipv4_handle_fragmentation) does: the first fragment records its ports
 * under the datagram's identity, and each later one takes them, so it gets
 * the same decision as the first: the same view, conntrack entry,
 * translation and policy. Only addresses of a later fragment are
 * rewritten (nat_rewrite), its payload never.
 *
 * The identity is the full tuple a sender's stack keeps the ID unique in
 * (family, protocol, source, destination, IP ID) plus the networks the
 * packet travels between: a later fragment from another network (an
 * overlapping subnet, another tenant guessing the ID) finds no record and
 * never takes a flow it did not open. A later fragment without a record
 * (it overtook its first fragment, or the first was lost or never sent) is
 * dropped and counted (fragment-before-first), as Cilium drops it; the
 * sender's reassembly timeout then reports the datagram lost. Nothing but
 * a first fragment ever writes a record, so a later fragment never opens
 * a flow by itself. */
#ifndef LACE_FRAG_H
#define LACE_FRAG_H

#include "lace.h"
#include "ct.h"

struct frag_key {
	__u32 src_net; /* the context the packet comes from (a pod's network, the SID's source network, an external network) */
	__u32 dst_net; /* the context it is delivered in, where the program knows it; else 0 */
	__u8 family;
	__u8 proto;
	__u16 pad;
	__u32 id; /* the IP ID, network order */
	__u8 saddr[16];
	__u8 daddr[16];
};

struct frag_val {
	__u64 expires; /* bpf_ktime_get_ns() deadline */
	__u16 sport;
	__u16 dport;
	__u8 icmp_type;
	/* The first's TCP flags: a SYN's later fragment is a SYN to every
	 * decision (is_reply_to_host lets "answers" to the node). */
	__u8 tcp_flags;
	__u8 pad[2];
};

/* A datagram's fragments follow each other within milliseconds; a record
 * lives a few seconds (Linux gives up reassembly after 30 s, but holding
 * an ID that long only widens the window for a guessed one). */
#define FRAG_TIMEOUT (10 * NSEC)

/* LRU: a burst of large datagrams evicts the oldest records (whose
 * datagrams are long reassembled), never anything else. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct frag_key);
	__type(value, struct frag_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lace_frags SEC(".maps");

/* frag_track gives a later fragment the ports of its datagram's first
 * fragment (recorded here when it passed between the same networks), and
 * records a first fragment's. 0 when p may go on (not a fragment, a first
 * one, a later one now with its ports); -1 for a later fragment without a
 * record: the caller drops it (fragment-before-first) or leaves it to the
 * host. Out of line: a small frame of its own, off the deepest chains. */
static __noinline __attribute__((unused)) int frag_track(struct pkt *p, __u32 src_net, __u32 dst_net)
{
	if (!p || !p->frag)
		return 0;
	struct frag_key k = {.src_net = src_net, .dst_net = dst_net, .family = p->family, .proto = p->proto, .id = p->frag_id};
	__builtin_memcpy(k.saddr, p->saddr, 16);
	__builtin_memcpy(k.daddr, p->daddr, 16);
	__u64 now = bpf_ktime_get_ns();
	if (p->frag == PKT_FRAG_FIRST) {
		struct frag_val v = {.expires = now + FRAG_TIMEOUT, .sport = p->sport, .dport = p->dport, .icmp_type = p->icmp_type, .tcp_flags = p->tcp_flags};
		bpf_map_update_elem(&lace_frags, &k, &v, BPF_ANY);
		return 0;
	}
	struct frag_val *v = bpf_map_lookup_elem(&lace_frags, &k);
	if (!v || v->expires < now)
		return -1;
	p->sport = v->sport;
	p->dport = v->dport;
	p->icmp_type = v->icmp_type;
	p->tcp_flags = v->tcp_flags;
	return 0;
}

/* frag_forget drops the record the first fragment p would write: the
 * caller does not translate its datagram, so the datagram's later
 * fragments must not find an older datagram's record under the same ID
 * (16 bits in IPv4) and leave with that datagram's translation. */
static __noinline __attribute__((unused)) int frag_forget(struct pkt *p, __u32 src_net, __u32 dst_net)
{
	if (!p || p->frag != PKT_FRAG_FIRST)
		return 0;
	struct frag_key k = {.src_net = src_net, .dst_net = dst_net, .family = p->family, .proto = p->proto, .id = p->frag_id};
	__builtin_memcpy(k.saddr, p->saddr, 16);
	__builtin_memcpy(k.daddr, p->daddr, 16);
	bpf_map_delete_elem(&lace_frags, &k);
	return 0;
}

#endif
