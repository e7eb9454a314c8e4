// Package netpol compiles Kubernetes NetworkPolicy (networking.k8s.io/v1)
// into the lookup tables one node's data plane decides a packet with: the
// isolation of each local endpoint, the class of every peer address (pod
// addresses per Lace network, and CIDR regions), and a longest-prefix table
// of verdicts keyed by (endpoint, class, direction, protocol, port).
//
// It owns the translation from policy semantics to those tables, and a
// reference evaluation (Decide) written straight from the API semantics
// that checks it. It must not touch the kernel, the API server or the
// eBPF maps: it is pure, single-threaded and deterministic (the same Input
// always yields reflect.DeepEqual Tables), so the agent can diff its output
// against what the maps hold and write only the difference.
//
// The data plane decides in three steps (see Tables.Lookup, which is that
// algorithm in Go): an endpoint not isolated in a direction allows
// everything; otherwise the peer's address (after service translation) is
// turned into a class, exact match on (network, address) first and a
// longest-prefix match on the address alone second; then the verdict
// table is looked up with the longest prefix of
// ifindex(32) class(32) dir(8) proto(8) port(16). A miss drops the packet.
//
// Invalid objects (that the API server's validation would reject) never
// make Compile panic: the invalid part matches nothing, so a broken policy
// isolates its pods without opening anything (fail closed).
package netpol
