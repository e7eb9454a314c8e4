package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NetworkEndpointSpec is one pod's attachment to its network.
type NetworkEndpointSpec struct {
	// Network is the name of the Network the pod is bound to.
	// +required
	Network string `json:"network"`
	// Node is the node the pod runs on.
	// +required
	Node string `json:"node"`
	// Addresses are the pod's addresses in the network, at most one per family.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=2
	Addresses []IPAddress `json:"addresses,omitempty"`
	// MAC is the pod interface's MAC address.
	// +optional
	MAC MACAddress `json:"mac,omitempty"`
	// Interface is the pod's interface name inside its namespace.
	// +optional
	Interface string `json:"interface,omitempty"`
	// Learned are the MACs and addresses the pod's port sent that its
	// l2 network did not assign, learned by the node (spec.l2.learning),
	// oldest first. lace-controller publishes each as an FDBEntry and a
	// Neighbor held for this endpoint, unless another holds it.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Learned []LearnedBinding `json:"learned,omitempty"`
	// Activated is written by the pod's node when the VM of a live
	// migration showed up at this pod's port (its first frame, or its
	// announcement: RARP, gratuitous ARP, unsolicited neighbour
	// advertisement) while its MAC lived on another node. lace-controller
	// then moves the MAC's FDBEntry here, with its sequence one higher.
	// +optional
	Activated *L2Activation `json:"activated,omitempty"`
}

// L2Activation is a MAC that showed up at its standby port.
type L2Activation struct {
	// MAC is the MAC that showed up.
	// +required
	MAC MACAddress `json:"mac"`
	// Sequence is the low 32 bits of the MAC's FDBEntry sequence the node
	// held when it showed up: a later move makes it stale.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	Sequence int64 `json:"sequence,omitempty"`
}

// LearnedBinding is a MAC, and an address bound to it, that a port sent.
type LearnedBinding struct {
	// MAC is the source MAC.
	// +required
	MAC MACAddress `json:"mac"`
	// Address is the source address sent from MAC, if any.
	// +optional
	Address IPAddress `json:"address,omitempty"`
	// Sequence is the MAC's move sequence this port claims it with: one
	// more than the FDBEntry's when the MAC lived elsewhere.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1099511627776
	Sequence int64 `json:"sequence,omitempty"`
}

// NetworkEndpointStatus reports what lace-controller assigned and whether
// the attachment is programmed.
type NetworkEndpointStatus struct {
	// Addresses are the addresses lace-controller assigned the pod in an
	// l2 network (global IPAM), at most one per family; each is held by a
	// Neighbor of the network. Empty for l3 networks, whose node assigns
	// addresses from its own block.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=2
	Addresses []IPAddress `json:"addresses,omitempty"`
	// MAC is the MAC address lace-controller assigned the pod in an l2
	// network, held by an FDBEntry.
	// +optional
	MAC MACAddress `json:"mac,omitempty"`
	// Conditions: AddressesAllocated (l2), False with reason
	// SubnetExhausted when the network has no free address.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NetworkEndpoint records a pod's attachment: network, node, addresses, MAC.
// It is owned by its Pod.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=nep,categories=lace
// +kubebuilder:printcolumn:name="Network",type=string,JSONPath=`.spec.network`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.spec.addresses`
// +kubebuilder:printcolumn:name="MAC",type=string,JSONPath=`.spec.mac`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NetworkEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   NetworkEndpointSpec   `json:"spec"`
	Status NetworkEndpointStatus `json:"status,omitempty"`
}

// ConditionAddressesAllocated on a NetworkEndpoint of an l2 network is
// True once lace-controller assigned its addresses and MAC (status), and
// False with reason SubnetExhausted when the network has none free.
const ConditionAddressesAllocated = "AddressesAllocated"

// PublisherController is the Publisher of the Neighbors and FDBEntries
// lace-controller allocates.
const PublisherController = "lace-controller"

// NetworkEndpointList is a list of NetworkEndpoints.
//
// +kubebuilder:object:root=true
type NetworkEndpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NetworkEndpoint `json:"items"`
}

// NeighborSpec binds an IP address of an l2 network to a MAC address.
type NeighborSpec struct {
	// Network is the name of the l2 Network.
	// +required
	Network string `json:"network"`
	// Address is the IP address.
	// +required
	Address IPAddress `json:"address"`
	// MAC is the MAC address the IP address resolves to.
	// +required
	MAC MACAddress `json:"mac"`
	// Learned is true when the binding was learned from traffic rather
	// than allocated.
	// +optional
	Learned bool `json:"learned,omitempty"`
	// Sequence orders moves of a learned address between ports: the
	// highest sequence wins.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1099511627776
	Sequence int64 `json:"sequence,omitempty"`
	// Publisher is who published the binding: lace-controller for an
	// allocated address, the node that saw it for a learned one.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Publisher string `json:"publisher,omitempty"`
}

// Neighbor is an IP to MAC binding in an l2 network, used to answer ARP and
// neighbour solicitations without flooding.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=nbr,categories=lace
// +kubebuilder:printcolumn:name="Network",type=string,JSONPath=`.spec.network`
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.spec.address`
// +kubebuilder:printcolumn:name="MAC",type=string,JSONPath=`.spec.mac`
// +kubebuilder:printcolumn:name="Learned",type=boolean,JSONPath=`.spec.learned`
// +kubebuilder:printcolumn:name="Sequence",type=integer,JSONPath=`.spec.sequence`,priority=1
// +kubebuilder:printcolumn:name="Publisher",type=string,JSONPath=`.spec.publisher`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Neighbor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec NeighborSpec `json:"spec"`
}

// NeighborList is a list of Neighbors.
//
// +kubebuilder:object:root=true
type NeighborList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Neighbor `json:"items"`
}

// FDBEntrySpec places a MAC address of an l2 network on a node.
type FDBEntrySpec struct {
	// Network is the name of the l2 Network.
	// +required
	Network string `json:"network"`
	// MAC is the MAC address.
	// +required
	MAC MACAddress `json:"mac"`
	// Node is where the MAC currently lives.
	// +required
	Node string `json:"node"`
	// Sequence orders moves of the MAC: the highest sequence wins.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1099511627776
	Sequence int64 `json:"sequence,omitempty"`
	// Standby is another node where the MAC may show up next: a live
	// migration's target, running a second pod of the MAC's IPAMClaim.
	// Every node moves the MAC there the moment it shows up there (the
	// target's announcement, or the VM's first frame), before this object
	// says so.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Standby string `json:"standby,omitempty"`
	// Learned is true when the location was learned from traffic.
	// +optional
	Learned bool `json:"learned,omitempty"`
	// Publisher is who published this location: lace-controller for an
	// assigned MAC, the node that saw it for a learned one.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Publisher string `json:"publisher,omitempty"`
}

// FDBEntryStatus reports on a learned MAC.
type FDBEntryStatus struct {
	// Conditions: Frozen (True while the MAC may not move: it moved 5
	// times within 180 seconds, a duplicate MAC or a loop).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ConditionFrozen on an FDBEntry is True while its learned MAC may not
// move (reason MACFlapping).
const ConditionFrozen = "Frozen"

// FDBEntry is the location (node) of a MAC address in an l2 network.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=fdb,categories=lace
// +kubebuilder:printcolumn:name="Network",type=string,JSONPath=`.spec.network`
// +kubebuilder:printcolumn:name="MAC",type=string,JSONPath=`.spec.mac`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Sequence",type=integer,JSONPath=`.spec.sequence`
// +kubebuilder:printcolumn:name="Standby",type=string,JSONPath=`.spec.standby`,priority=1
// +kubebuilder:printcolumn:name="Learned",type=boolean,JSONPath=`.spec.learned`
// +kubebuilder:printcolumn:name="Publisher",type=string,JSONPath=`.spec.publisher`
// +kubebuilder:printcolumn:name="Frozen",type=string,JSONPath=`.status.conditions[?(@.type=="Frozen")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FDBEntry struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   FDBEntrySpec   `json:"spec"`
	Status FDBEntryStatus `json:"status,omitempty"`
}

// FDBEntryList is a list of FDBEntries.
//
// +kubebuilder:object:root=true
type FDBEntryList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FDBEntry `json:"items"`
}

func init() {
	SchemeBuilder.Register(
		&NetworkEndpoint{}, &NetworkEndpointList{},
		&Neighbor{}, &NeighborList{},
		&FDBEntry{}, &FDBEntryList{},
	)
}
