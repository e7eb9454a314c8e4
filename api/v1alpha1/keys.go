package v1alpha1

// The lace-cni.io keys Lace writes or reads on objects: labels, annotations
// and finalizers. They are part of the API (users, the chart's YAML and the
// e2e tests spell them as strings), so they are defined once, here, and every
// Go package refers to these constants.

// Labels.
const (
	// LabelNetwork names a network. lace-controller puts it on the
	// Allocations it creates and lists them by it (internal/controller
	// network.go); the agent puts it on the NetworkEndpoints it writes
	// (internal/agent/cni server.go); the chart puts it on its default Networks
	// and its routing policies select on it, as the lab's demo does.
	LabelNetwork = "lace-cni.io/network"
	// LabelNetworkUID is the UID of the Network an Allocation was made
	// for. Written and read by lace-controller: an Allocation whose UID
	// differs is left from a deleted Network of the same name.
	LabelNetworkUID = "lace-cni.io/network-uid"
	// LabelNode names the node of an Allocation (written by
	// lace-controller) or of a NetworkEndpoint (written by the agent of
	// that node). The agent lists and caches only its node's
	// NetworkEndpoints by it; the chart's node-restriction admission
	// policy lets an agent write only objects carrying its own node.
	LabelNode = "lace-cni.io/node"
	// LabelPodUID is the UID of the pod a NetworkEndpoint records, written
	// by the agent. Read by the agent (recovery), the model (service
	// endpoints, internal/model services.go) and lacectl trace: a record
	// whose UID differs is left from an earlier pod of the same name.
	LabelPodUID = "lace-cni.io/pod-uid"
	// LabelAgentLease ("true") marks the agents' heartbeat Leases. Written
	// by the agent; read by the agents (load balancer announcement: which
	// nodes are alive) and by lacectl.
	LabelAgentLease = "lace-cni.io/agent-lease"
	// LabelAgentStopped ("lace-cni.io/agent=stopped") on a Node keeps the
	// agent DaemonSet off it (the chart's agent affinity reads it). Written
	// by an operator, or by the lab's `lace-lab stop agent/NODE`.
	LabelAgentStopped = "lace-cni.io/agent"
	// LabelEndpointUID is the UID of the NetworkEndpoint a Neighbor or
	// FDBEntry was allocated for (an l2 network's global IPAM; its
	// namespace/name are in AnnotationEndpoint, too long for a label).
	// Written by lace-controller (internal/controller l2ipam.go), which
	// deletes them once that NetworkEndpoint is gone or replaced (another
	// UID); read by the agents and users.
	LabelEndpointUID = "lace-cni.io/endpoint-uid"
	// LabelIPAMClaimUID is the UID of the IPAMClaim a Neighbor or FDBEntry
	// is kept for, instead of an endpoint: it outlives the pods naming the
	// claim (namespace/name in AnnotationIPAMClaim). Written by
	// lace-controller, which deletes them with the claim; read by users.
	LabelIPAMClaimUID = "lace-cni.io/ipam-claim-uid"
)

// Annotations.
const (
	// AnnotationEndpoint is "namespace/name" of the NetworkEndpoint a
	// Neighbor or FDBEntry was allocated for (with LabelEndpointUID).
	// Written and read by lace-controller; read by users.
	AnnotationEndpoint = "lace-cni.io/endpoint"
	// AnnotationStandbyEndpoint is, on an FDBEntry with spec.standby,
	// "namespace/name" of the NetworkEndpoint of the pod there (a live
	// migration's target): the standby goes with it. Written and read by
	// lace-controller.
	AnnotationStandbyEndpoint = "lace-cni.io/standby-endpoint"
	// AnnotationRestartGrace is on an agent's heartbeat Lease, written by
	// the agent as it stops for a restart (a Go duration): the other
	// agents count its node alive that long from when they see it
	// (capped), so a rolling restart moves no LoadBalancer VIP. The next
	// agent's first renewal removes it.
	AnnotationRestartGrace = "lace-cni.io/restart-grace"
	// AnnotationRenewWait is on an agent's heartbeat Lease, written by
	// the agent at each renewal (a Go duration): how long its previous
	// renewal waited for the API server's answer. The agent renews again
	// only once a renewal answered, so the others credit its silence
	// that much (at most a lease duration).
	AnnotationRenewWait = "lace-cni.io/renew-wait"
	// AnnotationMigrationTargetReady is KubeVirt's, on a live
	// migration's target pod (virt-launcher): the time the target was
	// ready to run the VM. Read by lace-agent: the VM's MAC moves to the
	// pod's standby port then, as on the VM's first frame there.
	AnnotationMigrationTargetReady = "kubevirt.io/migration-target-ready-timestamp"
	// AnnotationMoves is, on a learned FDBEntry or Neighbor, the times
	// (Unix milliseconds, comma-separated, newest last, at most 5) it
	// moved between endpoints: lace-controller freezes one that moved 5
	// times within 180 seconds (AnnotationFrozenUntil).
	AnnotationMoves = "lace-cni.io/moves"
	// AnnotationFrozenUntil is, on a learned FDBEntry or Neighbor, the
	// time (RFC 3339) until which lace-controller refuses to move it.
	AnnotationFrozenUntil = "lace-cni.io/frozen-until"
	// AnnotationIPAMClaim is, on a Neighbor or FDBEntry, "namespace/name"
	// of the IPAMClaim it is kept for (with LabelIPAMClaimUID), written and
	// read by lace-controller. On a Pod it names the IPAMClaim (in the
	// pod's namespace) whose addresses the pod takes in its l2 network,
	// written by the user or the workload's controller and read by
	// lace-controller; KubeVirt's k8s.ovn.org/primary-udn-ipamclaim is
	// read the same way.
	AnnotationIPAMClaim = "lace-cni.io/ipam-claim"
	// AnnotationIPAddresses asks, on a Pod of an l2 network, for fixed
	// addresses (comma-separated, one per family), refused with condition
	// AddressesAllocated False (AddressTaken) when held. Written by users,
	// read by lace-controller.
	AnnotationIPAddresses = "lace-cni.io/ip-addresses"
	// AnnotationMACAddress asks, on a Pod of an l2 network, for a fixed
	// MAC. Written by users, read by lace-controller.
	AnnotationMACAddress = "lace-cni.io/mac-address"
	// AnnotationOVNPrimaryUDNIPAMClaim is the annotation KubeVirt's
	// ipam-extensions puts on a VM's pod for its primary network's
	// IPAMClaim (OVN-Kubernetes' name), read like AnnotationIPAMClaim so
	// KubeVirt works unchanged.
	AnnotationOVNPrimaryUDNIPAMClaim = "k8s.ovn.org/primary-udn-ipamclaim"
	// AnnotationServiceNetwork names the network a Service is bound to
	// (its endpoints are resolved and reached in it). Written by
	// lace-controller (internal/controller service.go); read by lacectl
	// and by users.
	AnnotationServiceNetwork = "lace-cni.io/network"
	// AnnotationExcludedEndpoints lists the endpoint addresses of a
	// Service left out because their pod is in another network
	// (comma-separated, at most 20, then "… and N more"). Written by
	// lace-controller, read by users.
	AnnotationExcludedEndpoints = "lace-cni.io/excluded-endpoints"
	// AnnotationBindingError says why a Service is bound to no network
	// (and so not served). Written by lace-controller; read by lacectl
	// and by users.
	AnnotationBindingError = "lace-cni.io/binding-error"
	// AnnotationRefusedEndpoints lists the endpoint addresses of a Service
	// no agent serves (model.HostEndpoints: a node's address naming no
	// hostNetwork pod of the namespace on it, the API server's, loopback
	// and the like), comma-separated, at most 20, then "… and N more".
	// Written by lace-controller, read by users.
	AnnotationRefusedEndpoints = "lace-cni.io/refused-endpoints"
	// AnnotationExternalIPProblem is written by lace-controller on a
	// Service some of whose spec.externalIPs are not served: "Reason:
	// external IPs not served: addr (reason: detail), ...". Its value
	// changes only when the verdict does, and each change comes with a
	// Warning Event, so an idle cluster stays quiet. Reasons:
	// ExternalIPNotAllowed (outside the operator's allow-list),
	// ExternalIPReserved (a node address, pod subnet or service range),
	// ExternalIPInvalid, ExternalIPContested (an older Service, or a load
	// balancer address, holds it). Read by lace-controller (to stay
	// quiet), lacectl and users.
	AnnotationExternalIPProblem = "lace-cni.io/external-ip-problem"
	// AnnotationLoadBalancerProblem remembers the last VIP allocation
	// problem of a Service (reason: message), so its Warning is emitted
	// once per change, not at every pass: an idle cluster stays quiet.
	// Written and read by lace-controller (internal/controller
	// loadbalancer.go); read by users.
	AnnotationLoadBalancerProblem = "lace-cni.io/load-balancer-problem"
	// AnnotationLoadBalancerIPs asks for specific LoadBalancer VIPs
	// (comma-separated, one per family), as spec.loadBalancerIP
	// (deprecated upstream) does for one. Written by users; read by the
	// model's VIP allocation (internal/model lbipam.go) in lace-controller.
	AnnotationLoadBalancerIPs = "lace-cni.io/load-balancer-ips"
	// AnnotationTrafficDistribution is Lace's own distribution preference
	// on a Service (its one value: model.TrafficDistributionPreferClosest).
	// Written by users; read by the agents' service tables
	// (internal/model services.go, kept by the agent's cache trim) and
	// lacectl.
	AnnotationTrafficDistribution = "lace-cni.io/traffic-distribution"
)

// Finalizers.
const (
	// FinalizerBlockRelease keeps an Allocation's prefixes reserved until
	// the nodes have withdrawn their routes to it, so a block is never
	// handed to a new node while traffic may still be routed to the old
	// one. Added and removed by lace-controller (internal/controller
	// network.go).
	FinalizerBlockRelease = "lace-cni.io/block-release"
)

// LoadBalancerClassPrefix starts spec.loadBalancerClass of a Service that
// names a LoadBalancerClass of Lace: lace-cni.io/<class name>. Written by
// users; read by the model's VIP allocation and by lacectl.
const LoadBalancerClassPrefix = "lace-cni.io/"

// IPAMClaimOf is the IPAMClaim (in the pod's namespace) that a pod with
// annotations ann names, if any: AnnotationIPAMClaim first, else
// KubeVirt's AnnotationOVNPrimaryUDNIPAMClaim.
func IPAMClaimOf(ann map[string]string) string {
	if n := ann[AnnotationIPAMClaim]; n != "" {
		return n
	}
	return ann[AnnotationOVNPrimaryUDNIPAMClaim]
}
