/* Shared definitions of Lace's eBPF data plane: the drop reasons and
 * forwarding counters (internal/datapath generates its tables from the
 * enums below), the SID layout, the programs' return conventions and the
 * counting helpers. It includes the rest every program needs:
 *   maps.h  the map layout shared with Go (structs and pinned maps);
 *   parse.h packet parsing into struct pkt, address comparisons;
 *   csum.h  checksum helpers (fold, TTL rewrite). */
#ifndef LACE_H
#define LACE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/icmpv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

/* Debian's UAPI headers predate these flags; the values are the kernel's
 * (internal/datapath checks them against the running kernel's BTF). */
#define LACE_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define LACE_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)

#define AF_INET 2
#define AF_INET6 10

/* SID function layout, in the 64 bits after a node's /64 locator:
 * byte 8 is the behaviour, bytes 10-11 the source network ID (the context
 * the flow comes from: the receiving node records it in conntrack and
 * sends replies back in it), bytes 12-15 the destination network ID (big
 * endian). */
#define SID_BEHAVIOUR_BYTE 8
#define SID_SRC_NET_BYTE 10
#define SID_NET_BYTE 12
#define SID_L3_DECAP 1 /* End.DT46: decapsulate, look up in network N */
/* End.DT2U of an l2 network's unicast IP frame carried as its IP packet
 * (next header 4 or 41, as an l3 packet, so GSO is kept): the receiver
 * rebuilds the Ethernet header from the network's neighbour table (the
 * sender checked that the frame's MACs are its addresses'). */
#define SID_L2_IP 4
/* End.DT2M of an l2 network: the whole Ethernet frame (next header 143)
 * of a broadcast or multicast, delivered to every port of the network on
 * the receiving node. */
#define SID_L2_FLOOD 3

/* The nodes' own context: a network ID no Network is given (the controller
 * stops one short). A SID naming it carries a flow between a node's
 * address and a pod, the external frontends' translated flows: its view
 * holds the other nodes' addresses, and a packet decapsulated in it is the
 * answer to a flow that node translated (underlay.c, xlb_in). */
#define NODE_NET_ID 0xffff

/* Drop reasons and forwarding counters. The comment of each is its name
 * and meaning as operators see them (metrics, lacectl): internal/datapath
 * generates its tables from these lines (go generate), so C and Go cannot
 * disagree. Keep the form NAME = N, / * name: meaning * /. */
enum drop_reason {
	DROP_NOT_IP = 0, /* link-local: not IP, or ND, MLD or a link-local source from a pod */
	DROP_SPOOF = 1, /* spoofed-source: the source address is not the pod's */
	DROP_ISOLATED = 2, /* isolated: the destination is in no network the source's view holds */
	DROP_ANONYMOUS = 3, /* anonymous-network: an anonymous network without a self policy */
	DROP_NO_ENDPOINT = 4, /* no-endpoint: inside a local block but no such pod */
	DROP_TTL = 5, /* ttl-exceeded: TTL or hop limit exhausted */
	DROP_FIB = 6, /* no-underlay-route: no underlay route to the SID */
	DROP_HOST = 7, /* to-node-not-answer: pod to node traffic that is not an answer */
	DROP_DECAP_SOURCE = 8, /* decap-unknown-source: SRv6 from an address that is no node's */
	DROP_DECAP_SID = 9, /* decap-unknown-sid: the SID names no known network or behaviour */
	DROP_DECAP_PROTO = 10, /* decap-bad-protocol: the SID packet carries neither IPv4 nor IPv6 */
	DROP_ADJUST = 11, /* header-adjust-failed: changing header room failed */
	DROP_UNKNOWN_PORT = 12, /* unknown-port: a pod port without endpoint state */
	DROP_NOT_LOCAL = 13, /* not-for-this-node: plain IP from the underlay to an outside address: a node is no router */
	DROP_DECAP_TRUNCATED = 14, /* decap-truncated: an SRv6 packet too short for its inner header */
	DROP_DECAP_EXT_HEADER = 15, /* decap-extension-header: an SRv6 packet with an IPv6 extension header */
	DROP_DECAP_FRAGMENT = 16, /* decap-fragment: a fragmented SRv6 packet */
	DROP_MTU = 17, /* too-big: larger than the underlay carries; the sender got ICMP fragmentation-needed or packet-too-big */
	DROP_UNCLASSIFIED = 18, /* unclassified-source: plain IP from a source no external network's prefix covers */
	DROP_SNAT = 19, /* snat-failed: no free SNAT port on the node toward this destination */
	DROP_NO_SERVICE_PORT = 20, /* no-service-port: a VIP on a port no service serves (rejected: ICMP port unreachable) */
	DROP_NO_BACKEND = 21, /* no-endpoints: a service without endpoints (rejected: ICMP port unreachable) */
	DROP_NO_LOCAL_BACKEND = 22, /* no-local-endpoints: internalTrafficPolicy Local and no endpoint on this node */
	DROP_FRONTEND_CLOSED = 23, /* frontend-closed: a NodePort on a node address whose external network no policy opens to the service's network */
	DROP_SOURCE_RANGE = 24, /* source-range: a source outside the service's loadBalancerSourceRanges */
	DROP_SNAT_CLOSED = 25, /* snat-closed: to a node SNAT port whose pod flow is over (its conntrack entry expired, was evicted or gave the port up) */
	DROP_NO_FLOW = 26, /* no-flow: a TCP segment that is no SYN toward an outside address, of no flow the node tracks (an answer to a flow that is over): it takes no SNAT port */
	DROP_OUTSIDE_SPOOF = 27, /* outside-spoofed-source: plain IP from the fabric with a source inside the cluster (a pod subnet, a service range, a node's locator) */
	DROP_CT_OTHER_NET = 28, /* flow-of-another-network: a packet whose tuple is a live flow of another network: it neither refreshes nor takes that flow */
	DROP_ICMP_NOT_OURS = 29, /* icmp-error-no-flow: an ICMP error from a pod about no flow conntrack holds for it with that peer */
	DROP_NODE_FORGED = 30, /* node-forged-underlay: the node's own stack sent SRv6 to a locator, or a packet from another node's address: only Lace's encapsulation speaks for the node */
	DROP_DECAP_FOREIGN = 31, /* decap-foreign-source: SRv6 whose inner source is a pod of a block the sending node does not own */
	DROP_FRAGMENT = 32, /* fragment: retired: a later fragment now takes its first fragment's ports (frag.h); see fragment-before-first */
	DROP_FRAG_NO_FIRST = 33, /* fragment-before-first: a later IP fragment whose first fragment (with the ports) was not seen: out of order, lost, forged, or of another network */
	DROP_ICMP_IN_NOT_OURS = 34, /* icmp-error-in-no-flow: an ICMP error toward a pod about no live flow of that pod whose peer is the error's sender (its network, or outside for an outside flow) */
	DROP_L2_SPOOF_MAC = 35, /* l2-spoofed-mac: a frame from an l2 port whose source MAC is not the port's */
	DROP_L2_UNKNOWN_DST = 36, /* l2-unknown-destination: a unicast frame to a MAC its l2 network does not know, on a network that does not learn (a learning one floods it); or flooded from another node to a MAC this node places */
	DROP_L2_UNKNOWN_NEIGH = 37, /* l2-unknown-neighbour: an ARP request or neighbour solicitation for an address its l2 network does not hold, on a network that does not learn (a learning one floods it); or flooded from another node for an address this node holds */
	DROP_L2_NOT_FORWARDED = 38, /* l2-not-forwarded: address resolution an l2 port does not send on (duplicate address detection, gratuitous ARP, ARP and ND replies, router solicitations, MLD) */
	DROP_L2_NO_ROUTER = 39, /* l2-no-router: a frame to the network's gateway while the routing program is not loaded */
	DROP_L2_NOT_CARRIED = 40, /* l2-frame-not-carried: a frame to a MAC on another node that is not IP addressed to that MAC's own address (only those cross nodes yet) */
	DROP_L2_FLOOD_NOT_CARRIED = 41, /* l2-flood-not-carried: a flooded frame too large to cross the fabric whole (segmentation offload): delivered on its node only */
	DROP_L2_LEARNING = 42, /* l2-learning: a frame of a learning l2 port from a MAC or address its network does not know yet: reported for learning, dropped until it is published */
	DROP_L2_STANDBY = 43, /* l2-standby: a frame at a live migration's target port before the VM showed up there (the target pod's own address configuration, never an announcement or the VM's data) */
	DROP_POLICY = 44, /* policy: refused by a NetworkPolicy of the pod it goes to or comes from (counted per policy: lace_policy_drops_total) */
	DROP_OTHER_HOST = 45, /* other-host: plain IP from the fabric in a frame sent to another MAC (a switch flooded it), not to one of the node's addresses */
	DROP_SNAT_RACE = 46, /* snat-lost-race: a new flow's first packet toward an outside destination whose SNAT port another new flow took at the same moment: the flow's next SYN or datagram takes another */
	DROP_MAX = 47,
};

enum fwd_counter {
	FWD_LOCAL = 0, /* local: delivered to a pod on this node */
	FWD_ENCAP = 1, /* encapsulated: encapsulated to another node */
	FWD_DECAP = 2, /* decapsulated: decapsulated and delivered */
	FWD_HOST = 3, /* to-host: a reply handed to the host */
	FWD_ICMP_ERROR = 4, /* icmp-error: an ICMP error sent back to a pod (time exceeded, too big) */
	FWD_SNAT = 5, /* to-external: a pod's flow sent to an external network with the node's address */
	FWD_FROM_EXTERNAL = 6, /* from-external: outside traffic (or an SNAT reply) delivered or forwarded to a pod */
	FWD_REPLY_OUT = 7, /* reply-out: a pod's reply to an outside source, sent from the pod's address */
	FWD_SERVICE = 8, /* to-service: a new flow to a service VIP translated to an endpoint */
	FWD_ANNOUNCE = 9, /* announced: an ARP or neighbour solicitation for a LoadBalancer VIP this node announces, answered */
	FWD_RESET_AHEAD = 10, /* reset-ahead: a node port given to a new flow toward an endpoint where its last flow may be half open: a reset sent there first */
	FWD_RESET_AHEAD_FAILED = 11, /* reset-ahead-failed: such a reset could not be sent (the new flow's SYN went without it) */
	FWD_L2_SWITCHED = 12, /* switched: an l2 frame delivered by destination MAC to a port on this node */
	FWD_L2_ANSWERED = 13, /* l2-answered: an ARP request or neighbour solicitation of an l2 port answered from its network's neighbour table */
	FWD_L2_FLOODED = 14, /* flooded: an l2 broadcast or multicast frame copied to its network's other ports on the node and to the other nodes with ports in it */
	FWD_L2_ACTIVATED = 15, /* l2-activated: an l2 MAC showed up at its standby port on this node (a live migration's target): it lives here from now on, announced to the other nodes */
	FWD_L2_MOVED = 16, /* l2-moved: a frame from the standby node of an l2 MAC (a live migration's target) moved the MAC there on this node */
	FWD_L2_UNKNOWN_FLOODED = 17, /* l2-unknown-flooded: on a learning l2 network, an ARP request or neighbour solicitation for an address it does not hold, or a unicast frame to a MAC it does not place, copied to its learning ports on this node and to the other nodes with ports in it (a silent guest is found as on a switch) */
	FWD_MAX = 18,
};

/* skb->mark of what Lace's own encapsulation sends (encap_and_send):
 * to_underlay lets only such packets reach another node's locator, and
 * only from this node's own address. The mark is no secret: SO_MARK needs
 * only CAP_NET_RAW since Linux 5.17 (docs/security.md section 8). The
 * value keeps clear of kube-proxy's 0x4000/0x8000 bits and Cilium's
 * 0x0F00 nibble, so neither reads our packets as theirs. */
#define LACE_MARK_ENCAP 0x1ace0001

#include "maps.h"
#include "parse.h"
#include "csum.h"

/* The key of every single-entry array, as a read-only map value: taking
 * its address costs no stack slot where the call chains have none. */
static const __u32 lace_zero_key = 0;

/* drop counts a drop by its reason and notes the reason for
 * flow_drop_tell (flows.h), which tells it when this run ends with the
 * packet dropped. Only drops pay for the note. */
static __always_inline int drop(__u32 reason)
{
	__u32 key = reason;
	__u64 *c = bpf_map_lookup_elem(&lace_drops, &key);
	if (c)
		*c += 1;
	__u32 *n = bpf_map_lookup_elem(&lace_drop_note, &lace_zero_key);
	if (n)
		*n = reason + 1;
	return TC_ACT_SHOT;
}

/* consumed ends a run that took the packet without dropping it (an
 * announcement answered, a frame flooded by clones): TC_ACT_SHOT, with no
 * drop to tell. */
static __always_inline int consumed(void)
{
	__u32 *n = bpf_map_lookup_elem(&lace_drop_note, &lace_zero_key);
	if (n)
		*n = 0;
	return TC_ACT_SHOT;
}

static __always_inline void count(__u32 what)
{
	__u64 *c = bpf_map_lookup_elem(&lace_forwarded, &what);
	if (c)
		*c += 1;
}

static __always_inline struct lace_config *config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&lace_cfg, &zero);
}

/* A forwarding function's answer that the packet needs an ICMP error
 * (too big), sent by the program itself so that the error's large stack
 * frame never adds to the deepest call chain. Not a TC action. */
#define RET_TOO_BIG 0x7000
/* The packet's destination answers ICMP port unreachable (a service port
 * without endpoints), sent by the program as RET_TOO_BIG is. */
#define RET_PORT_UNREACH 0x7001

static __always_inline int set_macs(struct __sk_buff *skb, const __u8 *dst, const __u8 *src)
{
	if (bpf_skb_store_bytes(skb, 0, dst, 6, 0))
		return -1;
	return bpf_skb_store_bytes(skb, 6, src, 6, 0);
}

#endif
