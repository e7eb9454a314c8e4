// Package netpol compiles Kubernetes NetworkPolicy (networking.k8s.io/v1)
// and ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1, its Admin
// and Baseline tiers) into the lookup tables one node's data plane decides
// a packet with: what each local endpoint needs looked up, the class of
// every peer address (pod addresses per Lace network, and CIDR regions:
// ipBlocks, networks, node addresses), and a longest-prefix table of
// verdicts keyed by (endpoint, class, direction, protocol, port).
//
// It owns the translation from policy semantics to those tables, and a
// reference evaluation (Decide) written straight from the API semantics
// that checks it. It must not touch the kernel, the API server or the
// eBPF maps: it is pure, single-threaded and deterministic (the same Input
// always yields reflect.DeepEqual Tables), so the agent can diff its output
// against what the maps hold and write only the difference.
//
// The three tiers (Admin ClusterNetworkPolicies, NetworkPolicies, Baseline
// ClusterNetworkPolicies) are folded at compile time into one verdict per
// key, so the data plane decides in three steps whatever the tiers (see
// Tables.Lookup, which is that algorithm in Go): an endpoint without a
// lookup in that direction allows everything; otherwise the peer's
// address (after service translation) is turned into a class, exact match
// on (network, address) first and a longest-prefix match on the address
// alone second; then the verdict table is looked up with the longest
// prefix of ifindex(32) class(32) dir(8) proto(8) port(16). A hit is the
// verdict (allow or drop); a miss drops the packet where a NetworkPolicy
// isolates the endpoint and passes it elsewhere.
//
// Invalid objects (that the API server's validation would reject) never
// make Compile panic, and fail closed: an invalid part of a NetworkPolicy
// matches nothing, so a broken policy isolates its pods without opening
// anything; an unrecognised part of a ClusterNetworkPolicy makes an Accept
// rule match nothing and a Deny or Pass rule match more, as cluster.go
// details.
package netpol
