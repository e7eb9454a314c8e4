package netpol

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Dir is a traffic direction seen from a local endpoint; a set of them is
// a bit mask (Endpoint.Isolated).
type Dir uint8

const (
	Ingress Dir = 1 << 0
	Egress  Dir = 1 << 1
)

// Port is a named container port of a pod.
type Port struct {
	Name     string
	Protocol corev1.Protocol // TCP, UDP, SCTP ("" means TCP)
	Port     int32
}

// Pod is what policies need of a pod. Its Labels and Ports are the
// agent's informer's own (netpolapi.PodsOf): a compile reads them and must
// never modify them.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	NetID           uint32       // the Lace network the pod's addresses are in
	Addrs           []netip.Addr // 0..2 (one per family)
	Ports           []Port       // containers' ports (only named ones matter)
}

// Local is a pod of this node: a policy subject.
type Local struct {
	Namespace, Name string // the pod (must be among Input.Pods to be a subject; a Local not in Pods is ignored)
	Ifindex         uint32
}

// Input is everything one node's policy tables depend on.
//
// Ambiguous inputs are resolved the same way by Compile and Decide: of
// several Pods (or Policies, ClusterPolicies, Nodes) with one name the
// first is the one; of several pods holding one (NetID, address) the first
// in namespace/name order owns it; of several Locals with one ifindex the
// first is kept.
type Input struct {
	Policies        []*networkingv1.NetworkPolicy
	ClusterPolicies []ClusterPolicy              // both tiers, in any order
	Pods            []Pod                        // every pod of the cluster that has addresses (peers), local ones included; never host-network pods
	Nodes           []Node                       // every node (for the nodes peers of ClusterPolicies)
	Namespaces      map[string]map[string]string // namespace name -> its labels (a namespace missing here has no labels)
	Local           []Local
}

// PeerKey names a peer address: addresses of two networks may overlap, so
// the network is part of the name.
type PeerKey struct {
	NetID uint32
	Addr  netip.Addr
}

// VerdictKey is one entry of the verdict LPM table. The data plane's key
// is ifindex(4) class(4) dir(1) proto(1) port(2, big-endian) and PrefixLen
// counts its bits from the start of ifindex; every bit past PrefixLen is 0
// here so that a key has exactly one spelling.
type VerdictKey struct {
	Ifindex   uint32
	Class     uint32
	Dir       Dir
	Proto     uint8  // 6, 17, 132, or 0 with PrefixLen 72
	Port      uint16 // host order here; only its first PrefixLen-80 bits count, the rest must be 0
	PrefixLen uint8  // 72, 80, 81..96
}

// Verdict is the value of a verdict entry: the final decision of every
// tier for the packets it covers, and the rule it is attributed to.
//
// Most entries name the deciding rule: a ClusterNetworkPolicy's Accept
// (Allow) or Deny (!Allow) rule, or the first NetworkPolicy rule (in
// namespace/name order) allowing the packet. An entry exists only where
// the decision differs from what a miss would mean, or names another
// policy; two kinds of entry then spell out a miss's own meaning, because
// a shorter entry (another rule's) covers the packet and must be
// overridden:
//   - Allow with Policy 0 (and Rule 0): no tier decided (a Pass led past
//     the last tier that could): the Kubernetes default, counted on no
//     policy;
//   - !Allow naming a NetworkPolicy (Rule 0): the endpoint's DenyIn or
//     DenyOut, a denial by NetworkPolicy isolation after an Admin Pass.
type Verdict struct {
	Policy uint32 // id of the deciding policy, 0 for "no tier decided"
	Rule   uint16 // index of that rule within the policy's Ingress or Egress list
	Allow  bool
}

// Endpoint is what the data plane needs of a local endpoint before the
// verdict table: whether to look it up at all, and what a miss means.
type Endpoint struct {
	// Lookup: directions in which the verdict table is looked up, those in
	// which a NetworkPolicy isolates the pod or a ClusterNetworkPolicy
	// rule that can match some packet applies to it. In any other
	// direction the packet passes.
	Lookup Dir
	// Isolated: directions in which a NetworkPolicy selects the pod, where
	// a miss drops the packet; in Lookup but not Isolated a miss passes.
	Isolated Dir
	DenyIn   uint32 // policy a missed ingress packet is counted on: the first NetworkPolicy (namespace/name order) isolating it for ingress; 0 if not isolated
	DenyOut  uint32
}

// PolicyRef names the object behind a policy id, for counters and logs.
type PolicyRef struct{ Kind, Namespace, Name string }

// String is "Kind namespace/name" (a cluster-scoped one without the
// namespace).
func (r PolicyRef) String() string {
	if r.Namespace == "" {
		return r.Kind + " " + r.Name
	}
	return r.Kind + " " + r.Namespace + "/" + r.Name
}

// Refs names every policy of in by its id, as Tables.Policies does for
// those a node's tables use.
func Refs(in Input) map[uint32]PolicyRef {
	out := map[uint32]PolicyRef{}
	for _, p := range in.Policies {
		out[PolicyID(kindNetworkPolicy, p.Namespace, p.Name)] = PolicyRef{Kind: kindNetworkPolicy, Namespace: p.Namespace, Name: p.Name}
	}
	for _, p := range in.ClusterPolicies {
		out[PolicyID(kindClusterNetworkPolicy, "", p.Name)] = PolicyRef{Kind: kindClusterNetworkPolicy, Name: p.Name}
	}
	return out
}

// The Kinds of the PolicyRefs this package emits.
const (
	kindNetworkPolicy        = "NetworkPolicy"
	kindClusterNetworkPolicy = "ClusterNetworkPolicy"
)

// Tables is one node's compiled policy state.
type Tables struct {
	Peers     map[PeerKey]uint32      // only non-zero classes
	CIDRs     map[netip.Prefix]uint32 // masked prefixes; class may be 0 (to carve an `except` out of a shorter prefix)
	Endpoints map[uint32]Endpoint     // only endpoints with a Lookup direction
	Verdicts  map[VerdictKey]Verdict
	Policies  map[uint32]PolicyRef // every policy id used in Verdicts or Endpoints
}

// Protocol numbers of the verdict key (0, any other protocol, appears
// only in prefix-72 keys, whose proto bits are past the prefix).
const (
	protoTCP  uint8 = 6
	protoUDP  uint8 = 17
	protoSCTP uint8 = 132
)

// Prefix lengths of the verdict key (bits from the start of ifindex).
const (
	prefixAnyProto = 72 // ifindex, class, dir
	prefixAnyPort  = 80 // + proto
)

const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

func fnvString(h uint32, s string) uint32 {
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= fnvPrime32
	}
	return h
}

// PolicyID is the stable id of a policy: FNV-1a 32 of kind/namespace/name.
// It is a pure function of the name, so ids (and the data plane's counters
// keyed by them) survive restarts and other policies' changes. 0 means "no
// policy" in Endpoint, so a name hashing to 0 is rehashed.
func PolicyID(kind, namespace, name string) uint32 {
	h := fnvString(fnvOffset32, kind+"/"+namespace+"/"+name)
	for h == 0 {
		h = fnvString(h^fnvOffset32, "\x00")
	}
	return h
}

// selectorOf converts a label selector. An invalid selector selects
// nothing rather than failing the whole compilation: the API server would
// have rejected it, and matching nothing is the fail-closed reading. A nil
// selector also selects nothing (callers handle "absent" themselves).
func selectorOf(ls *metav1.LabelSelector) labels.Selector {
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return labels.Nothing()
	}
	return s
}

// Lookup evaluates the tables exactly as the data plane does: whether to
// look up at all (Endpoint.Lookup), then the peer's class (exact (network,
// address), else the longest CIDR on the address alone, else 0), then the
// longest verdict prefix, and on a miss the endpoint's default (drop where
// Isolated, else pass). It returns whether the packet passes and the
// policy and rule it is attributed to: the entry's, or on a missed drop
// the endpoint's deny policy (rule 0), or 0 when it passes undecided.
// proto is the IP protocol number as the data plane sets it: 6, 17 or 132,
// else 0 with port 0.
func (t Tables) Lookup(ifindex uint32, dir Dir, peer PeerKey, proto uint8, port uint16) (allow bool, policy uint32, rule uint16) {
	ep, ok := t.Endpoints[ifindex]
	if !ok || ep.Lookup&dir == 0 {
		return true, 0, 0
	}
	class := t.classOf(peer)
	key := VerdictKey{Ifindex: ifindex, Class: class, Dir: dir, Proto: proto}
	for plen := 96; plen >= prefixAnyPort; plen-- {
		key.PrefixLen = uint8(plen)
		key.Port = port & portMask(plen-prefixAnyPort)
		if v, ok := t.Verdicts[key]; ok {
			return v.Allow, v.Policy, v.Rule
		}
	}
	key = VerdictKey{Ifindex: ifindex, Class: class, Dir: dir, PrefixLen: prefixAnyProto}
	if v, ok := t.Verdicts[key]; ok {
		return v.Allow, v.Policy, v.Rule
	}
	switch {
	case ep.Isolated&dir == 0:
		return true, 0, 0
	case dir == Ingress:
		return false, ep.DenyIn, 0
	}
	return false, ep.DenyOut, 0
}

// classOf is step 2 of the data plane's decision.
func (t Tables) classOf(peer PeerKey) uint32 {
	if c, ok := t.Peers[peer]; ok {
		return c
	}
	if !peer.Addr.IsValid() {
		return 0
	}
	for bits := peer.Addr.BitLen(); bits >= 0; bits-- {
		p, err := peer.Addr.Prefix(bits)
		if err != nil {
			return 0
		}
		if c, ok := t.CIDRs[p]; ok {
			return c
		}
	}
	return 0
}

// portMask keeps the first k bits of a port.
func portMask(k int) uint16 {
	return uint16(uint32(0xffff0000) >> k)
}
