package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NetworkType is the kind of a Network.
// +kubebuilder:validation:Enum=l3;l2;external
type NetworkType string

// Network types.
const (
	// NetworkTypeL3 is a routed network: each node owns blocks of the subnet.
	NetworkTypeL3 NetworkType = "l3"
	// NetworkTypeL2 is one flat L2 domain spanning every node.
	NetworkTypeL2 NetworkType = "l2"
	// NetworkTypeExternal names addresses outside the cluster.
	NetworkTypeExternal NetworkType = "external"
)

// CIDR is an IP prefix in CIDR notation with no host bits set.
// +kubebuilder:validation:MaxLength=43
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a CIDR prefix such as 10.40.0.0/16 or fd00:40::/48"
// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="must be a network address with no host bits set (for example 10.40.0.0/16, not 10.40.0.1/16)"
type CIDR string

// Subnet is the address space of a pod network in one IP family.
type Subnet struct {
	// Prefix is the subnet, in CIDR notation.
	// +required
	Prefix CIDR `json:"prefix"`

	// HostLocalPrefixLength is the size of the block each node receives
	// (l3 only, required there). It cannot be shorter than the prefix, and
	// leaves at least two addresses per block (the gateway and one pod).
	// +optional
	HostLocalPrefixLength *int32 `json:"hostLocalPrefixLength,omitempty"`
}

// NetworkSpec is what an operator declares about a Network.
//
// +kubebuilder:validation:XValidation:rule="self.type != 'l3' || has(self.ipv4Subnet) || has(self.ipv6Subnet)",message="an l3 network needs spec.ipv4Subnet or spec.ipv6Subnet"
// +kubebuilder:validation:XValidation:rule="self.type != 'l2' || has(self.ipv4Subnet) || has(self.ipv6Subnet)",message="an l2 network needs spec.ipv4Subnet or spec.ipv6Subnet"
// +kubebuilder:validation:XValidation:rule="self.type != 'l3' || !has(self.ipv4Subnet) || has(self.ipv4Subnet.hostLocalPrefixLength)",message="spec.ipv4Subnet.hostLocalPrefixLength is required for an l3 network (the size of each node's block)",fieldPath=".ipv4Subnet"
// +kubebuilder:validation:XValidation:rule="self.type != 'l3' || !has(self.ipv6Subnet) || has(self.ipv6Subnet.hostLocalPrefixLength)",message="spec.ipv6Subnet.hostLocalPrefixLength is required for an l3 network (the size of each node's block)",fieldPath=".ipv6Subnet"
// +kubebuilder:validation:XValidation:rule="self.type == 'l3' || !has(self.ipv4Subnet) || !has(self.ipv4Subnet.hostLocalPrefixLength)",message="spec.ipv4Subnet.hostLocalPrefixLength is only for l3 networks",fieldPath=".ipv4Subnet.hostLocalPrefixLength"
// +kubebuilder:validation:XValidation:rule="self.type == 'l3' || !has(self.ipv6Subnet) || !has(self.ipv6Subnet.hostLocalPrefixLength)",message="spec.ipv6Subnet.hostLocalPrefixLength is only for l3 networks",fieldPath=".ipv6Subnet.hostLocalPrefixLength"
// +kubebuilder:validation:XValidation:rule="self.type != 'l2' || !has(self.anonymous) || !self.anonymous",message="spec.anonymous is only for l3 networks: the ports of an l2 network are one segment and always reach each other; keep other networks out with routing policies",fieldPath=".anonymous"
// +kubebuilder:validation:XValidation:rule="self.type == 'l2' || !has(self.l2)",message="spec.l2 is only for l2 networks",fieldPath=".l2"
// +kubebuilder:validation:XValidation:rule="self.type != 'external' || (has(self.externalPrefixes) && size(self.externalPrefixes) > 0)",message="an external network needs spec.externalPrefixes"
// +kubebuilder:validation:XValidation:rule="self.type != 'external' || (!has(self.ipv4Subnet) && !has(self.ipv6Subnet))",message="an external network has no spec.ipv4Subnet or spec.ipv6Subnet: it is defined by spec.externalPrefixes"
// +kubebuilder:validation:XValidation:rule="self.type == 'external' || !has(self.externalPrefixes) || size(self.externalPrefixes) == 0",message="spec.externalPrefixes is only for external networks",fieldPath=".externalPrefixes"
// +kubebuilder:validation:XValidation:rule="has(self.ipv4Subnet) == has(oldSelf.ipv4Subnet)",message="spec.ipv4Subnet cannot be added or removed after creation",fieldPath=".ipv4Subnet"
// +kubebuilder:validation:XValidation:rule="has(self.ipv6Subnet) == has(oldSelf.ipv6Subnet)",message="spec.ipv6Subnet cannot be added or removed after creation",fieldPath=".ipv6Subnet"
type NetworkSpec struct {
	// Type is l3 (routed, per-node blocks), l2 (one flat L2 domain, for VMs)
	// or external (addresses outside the cluster). Immutable.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.type is immutable"
	Type NetworkType `json:"type"`

	// IPv4Subnet is the network's IPv4 address space (l3, l2). Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="isCIDR(self.prefix) && cidr(self.prefix).ip().family() == 4",message="spec.ipv4Subnet.prefix must be an IPv4 prefix",fieldPath=".prefix"
	// +kubebuilder:validation:XValidation:rule="!has(self.hostLocalPrefixLength) || !isCIDR(self.prefix) || (self.hostLocalPrefixLength >= cidr(self.prefix).prefixLength() && self.hostLocalPrefixLength <= 30)",message="spec.ipv4Subnet.hostLocalPrefixLength must be between the prefix length and 30",fieldPath=".hostLocalPrefixLength"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.ipv4Subnet is immutable"
	IPv4Subnet *Subnet `json:"ipv4Subnet,omitempty"`

	// IPv6Subnet is the network's IPv6 address space (l3, l2). Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="isCIDR(self.prefix) && cidr(self.prefix).ip().family() == 6",message="spec.ipv6Subnet.prefix must be an IPv6 prefix",fieldPath=".prefix"
	// +kubebuilder:validation:XValidation:rule="!has(self.hostLocalPrefixLength) || !isCIDR(self.prefix) || (self.hostLocalPrefixLength >= cidr(self.prefix).prefixLength() && self.hostLocalPrefixLength <= 126)",message="spec.ipv6Subnet.hostLocalPrefixLength must be between the prefix length and 126",fieldPath=".hostLocalPrefixLength"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.ipv6Subnet is immutable"
	IPv6Subnet *Subnet `json:"ipv6Subnet,omitempty"`

	// ExternalPrefixes are the underlay addresses this external network
	// stands for; an address belongs to the external network with the
	// longest matching prefix.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	ExternalPrefixes []CIDR `json:"externalPrefixes,omitempty"`

	// Anonymous suppresses the implicit route that lets endpoints reach
	// their own network: even they need a NetworkRoutingPolicy. l3 only:
	// an l2 network's ports are one segment.
	// +optional
	Anonymous bool `json:"anonymous,omitempty"`

	// L2 holds the options of an l2 network.
	// +optional
	L2 *L2Options `json:"l2,omitempty"`
}

// L2Options are the options of an l2 network.
type L2Options struct {
	// Learning lets a port carry addresses and MACs lace-controller did
	// not assign (a guest with a static address, a VRRP MAC): a source
	// the network does not know is learned from the port's traffic and
	// published as a Neighbor and an FDBEntry with learned: true, and may
	// move between ports (sequence + 1; a MAC that moves 5 times in 180
	// seconds is frozen). Without it every source is checked against the
	// port's assignment. An address or MAC lace-controller assigned is
	// never learned elsewhere.
	// +optional
	Learning bool `json:"learning,omitempty"`
}

// IPFamily is IPv4 or IPv6.
// +kubebuilder:validation:Enum=IPv4;IPv6
type IPFamily string

// IP families.
const (
	IPv4 IPFamily = "IPv4"
	IPv6 IPFamily = "IPv6"
)

// BlockUsage counts the node blocks of one family of an l3 network.
type BlockUsage struct {
	// Family is IPv4 or IPv6.
	Family IPFamily `json:"family"`
	// Allocated is the number of blocks held by Allocations.
	Allocated int32 `json:"allocated"`
	// Capacity is the number of blocks the subnet holds (capped at 2^31-1).
	Capacity int32 `json:"capacity"`
}

// NetworkStatus is what the controller decided and observed for a Network.
type NetworkStatus struct {
	// ID is the network's numeric identifier in the data plane (map keys,
	// SRv6 function bits). Unique among existing networks and stable for the
	// network's lifetime.
	// +optional
	ID int32 `json:"id,omitempty"`

	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Blocks is the node-block usage per family (l3 only).
	// +optional
	// +listType=map
	// +listMapKey=family
	Blocks []BlockUsage `json:"blocks,omitempty"`

	// Conditions: Ready, and BlocksAllocated (l3) which is False with reason
	// SubnetExhausted when a node is left without a block.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Network groups endpoints into an isolated network.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=lnet,categories=lace
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="IPv4",type=string,JSONPath=`.spec.ipv4Subnet.prefix`
// +kubebuilder:printcolumn:name="IPv6",type=string,JSONPath=`.spec.ipv6Subnet.prefix`
// +kubebuilder:printcolumn:name="ID",type=integer,JSONPath=`.status.id`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63",message="metadata.name of a Network must be a DNS label: lowercase letters, digits and '-', at most 63 characters"
type Network struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   NetworkSpec   `json:"spec"`
	Status NetworkStatus `json:"status,omitempty"`
}

// NetworkList is a list of Networks.
//
// +kubebuilder:object:root=true
type NetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Network `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Network{}, &NetworkList{})
}
