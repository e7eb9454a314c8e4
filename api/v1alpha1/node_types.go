package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPAddress is a single IPv4 or IPv6 address.
// +kubebuilder:validation:MaxLength=39
// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address such as 10.40.0.5 or fd00:40::5"
type IPAddress string

// MACAddress is an Ethernet address in lowercase colon notation.
// +kubebuilder:validation:Pattern=`^([0-9a-f]{2}:){5}[0-9a-f]{2}$`
type MACAddress string

// AllocationSpec is the prefix(es) of one l3 network given to one node.
type AllocationSpec struct {
	// Network is the name of the l3 Network the prefixes come from.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.network is immutable"
	Network string `json:"network"`
	// Node is the name of the Node that owns the prefixes.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.node is immutable"
	Node string `json:"node"`
	// Prefixes holds at most one block per IP family.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	// +listType=set
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.prefixes is immutable"
	Prefixes []CIDR `json:"prefixes"`
}

// Allocation records the block(s) of one l3 network given to one node. It is
// written only by the controller and owned by its Node.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=alloc,categories=lace
// +kubebuilder:printcolumn:name="Network",type=string,JSONPath=`.spec.network`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Prefixes",type=string,JSONPath=`.spec.prefixes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Allocation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec AllocationSpec `json:"spec"`
}

// AllocationList is a list of Allocations.
//
// +kubebuilder:object:root=true
type AllocationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Allocation `json:"items"`
}

// UnderlayEndpointSpec is a node's presence on the underlay. The controller
// writes node and locator; the node's agent writes addresses and zone (each
// with its own server-side-apply field manager).
type UnderlayEndpointSpec struct {
	// Node is the name of the Node.
	// +required
	Node string `json:"node"`
	// Addresses are the node's internal addresses on the underlay.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	Addresses []IPAddress `json:"addresses,omitempty"`
	// Zone is the node's topology.kubernetes.io/zone.
	// +optional
	Zone string `json:"zone,omitempty"`
	// Locator is the node's SRv6 locator prefix: every SID of the node lies
	// inside it.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self).ip().family() == 6",message="spec.locator must be an IPv6 prefix"
	Locator CIDR `json:"locator,omitempty"`
}

// DatapathStatus summarises a node's eBPF data plane: what changes only
// when pods, networks or nodes do, so that an idle node writes nothing.
// Counters that move with traffic (forwarded, dropped by reason) are
// Prometheus metrics on the agent's metrics endpoint.
type DatapathStatus struct {
	// Endpoints is the number of pod attachments on the node.
	Endpoints int32 `json:"endpoints"`
	// Maps is the number of entries of each data plane map.
	// +optional
	Maps map[string]int64 `json:"maps,omitempty"`
}

// Condition types and reasons of an UnderlayEndpoint.
const (
	// UnderlayReady is True when the node can carry pod traffic: it has an
	// IPv6 underlay address, routes to every other node's locator, and its
	// data plane is attached. False names the first problem as the reason
	// and every problem in the message.
	UnderlayReady = "Ready"

	ReasonUnderlayReady        = "UnderlayReady"
	ReasonNoIPv6Underlay       = "NoIPv6Underlay"
	ReasonLocatorUnreachable   = "LocatorUnreachable"
	ReasonKernelFeatureMissing = "KernelFeatureMissing"
	ReasonDatapathAttachFailed = "DatapathAttachFailed"
)

// UnderlayEndpointStatus is written by the node's agent.
type UnderlayEndpointStatus struct {
	// +optional
	Datapath *DatapathStatus `json:"datapath,omitempty"`
	// Conditions: Ready says whether the node can carry pod traffic.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// UnderlayEndpoint is a node's underlay addresses, zone and SRv6 locator.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=uep,categories=lace
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.spec.addresses`
// +kubebuilder:printcolumn:name="Zone",type=string,JSONPath=`.spec.zone`
// +kubebuilder:printcolumn:name="Locator",type=string,JSONPath=`.spec.locator`
// +kubebuilder:printcolumn:name="Endpoints",type=integer,JSONPath=`.status.datapath.endpoints`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
type UnderlayEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   UnderlayEndpointSpec   `json:"spec"`
	Status UnderlayEndpointStatus `json:"status,omitempty"`
}

// UnderlayEndpointList is a list of UnderlayEndpoints.
//
// +kubebuilder:object:root=true
type UnderlayEndpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []UnderlayEndpoint `json:"items"`
}

func init() {
	SchemeBuilder.Register(
		&Allocation{}, &AllocationList{},
		&UnderlayEndpoint{}, &UnderlayEndpointList{},
	)
}
