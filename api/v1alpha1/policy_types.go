package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MatchKind scopes a NetworkBindingPolicy to pods or services.
// +kubebuilder:validation:Enum=Pod;Service
type MatchKind string

// Match kinds.
const (
	MatchKindPod     MatchKind = "Pod"
	MatchKindService MatchKind = "Service"
)

// NetworkBindingPolicySpec decides which network a pod or service binds to.
type NetworkBindingPolicySpec struct {
	// Network is the name of the Network matching resources bind to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Network string `json:"network"`

	// Priority orders policies: the lowest value wins, ties are broken by
	// name (lexicographically).
	// +optional
	// +kubebuilder:validation:Minimum=0
	Priority int32 `json:"priority,omitempty"`

	// MatchKind limits the policy to Pods or Services; unset matches both.
	// +optional
	MatchKind MatchKind `json:"matchKind,omitempty"`

	// NamespaceSelector selects the namespaces of matching resources; unset
	// or empty selects every namespace.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// Selector selects matching pods or services by their labels; unset or
	// empty selects all of them.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}

// NetworkBindingPolicyStatus reports whether the policy is usable.
type NetworkBindingPolicyStatus struct {
	// Conditions: Ready is False with reason NetworkNotFound while the
	// named network does not exist.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NetworkBindingPolicy decides which network pods and services bind to.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nbp,categories=lace
// +kubebuilder:printcolumn:name="Network",type=string,JSONPath=`.spec.network`
// +kubebuilder:printcolumn:name="Priority",type=integer,JSONPath=`.spec.priority`
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.spec.matchKind`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NetworkBindingPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   NetworkBindingPolicySpec   `json:"spec"`
	Status NetworkBindingPolicyStatus `json:"status,omitempty"`
}

// NetworkBindingPolicyList is a list of NetworkBindingPolicies.
//
// +kubebuilder:object:root=true
type NetworkBindingPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NetworkBindingPolicy `json:"items"`
}

// NetworkRoutingPolicySpec lets source networks initiate traffic to
// destination networks (and so reach their services). Replies of allowed
// flows always come back; the reverse direction needs its own policy.
type NetworkRoutingPolicySpec struct {
	// SrcSelector selects the source Networks by label.
	// +required
	SrcSelector *metav1.LabelSelector `json:"srcSelector"`

	// DestSelector selects the destination Networks by label.
	// +required
	DestSelector *metav1.LabelSelector `json:"destSelector"`
}

// NetworkRoutingPolicyStatus reports which networks the policy selects
// and whether every pair it selects is in effect.
type NetworkRoutingPolicyStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// MatchedSources are the names of the networks (with a network ID) the
	// source selector matches, sorted.
	// +optional
	// +listType=atomic
	MatchedSources []string `json:"matchedSources,omitempty"`
	// MatchedDestinations are the names of the networks (with a network ID)
	// the destination selector matches, sorted.
	// +optional
	// +listType=atomic
	MatchedDestinations []string `json:"matchedDestinations,omitempty"`
	// Conditions: Ready is False with reason NoSourceNetworks or
	// NoDestinationNetworks while a selector matches no network,
	// InvalidSelector when a selector cannot be parsed, and PeeringConflict
	// when a pair it selects is refused because two overlapping pod
	// networks would share a view (the message names both networks and the
	// prefixes; the other pairs stay in effect); True with reason Accepted
	// otherwise.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RoutingPolicyStatus reports what a routing policy currently selects.
type RoutingPolicyStatus struct {
	// SourceNetworks are the names of the networks the source selector matches.
	// +optional
	SourceNetworks []string `json:"sourceNetworks,omitempty"`
	// DestinationNetworks are the names of the networks the destination selector matches.
	// +optional
	DestinationNetworks []string `json:"destinationNetworks,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NetworkRoutingPolicy lets a source network route to a destination network.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nrp,categories=lace
// +kubebuilder:printcolumn:name="Sources",type=string,JSONPath=`.status.matchedSources`
// +kubebuilder:printcolumn:name="Destinations",type=string,JSONPath=`.status.matchedDestinations`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NetworkRoutingPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   NetworkRoutingPolicySpec   `json:"spec"`
	Status NetworkRoutingPolicyStatus `json:"status,omitempty"`
}

// NetworkRoutingPolicyList is a list of NetworkRoutingPolicies.
//
// +kubebuilder:object:root=true
type NetworkRoutingPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NetworkRoutingPolicy `json:"items"`
}

// ServiceSelector selects destination networks of a ServiceRoutingPolicy,
// either by name or by labels.
//
// +kubebuilder:validation:XValidation:rule="has(self.name) != (has(self.matchLabels) || has(self.matchExpressions))",message="spec.destSelector needs exactly one of name, or matchLabels/matchExpressions"
type ServiceSelector struct {
	// Name selects one Network by name.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name,omitempty"`

	// MatchLabels selects Networks by label.
	// +optional
	MatchLabels map[string]string `json:"matchLabels,omitempty"`

	// MatchExpressions selects Networks by label expressions.
	// +optional
	// +listType=atomic
	MatchExpressions []metav1.LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// ServiceRoutingPolicySpec lets source networks reach the service VIPs of
// destination networks without reaching their pods.
type ServiceRoutingPolicySpec struct {
	// SrcSelector selects the source Networks by label.
	// +required
	SrcSelector *metav1.LabelSelector `json:"srcSelector"`

	// DestSelector selects the Networks whose services become reachable.
	// +required
	DestSelector ServiceSelector `json:"destSelector"`

	// NamespaceSelector limits the reachable services to namespaces whose
	// labels match; unset or empty admits every namespace.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
}

// ServiceRoutingPolicy lets a source network reach another network's services.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=srp,categories=lace
// +kubebuilder:printcolumn:name="Destination",type=string,JSONPath=`.spec.destSelector.name`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ServiceRoutingPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   ServiceRoutingPolicySpec `json:"spec"`
	Status RoutingPolicyStatus      `json:"status,omitempty"`
}

// ServiceRoutingPolicyList is a list of ServiceRoutingPolicies.
//
// +kubebuilder:object:root=true
type ServiceRoutingPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ServiceRoutingPolicy `json:"items"`
}

func init() {
	SchemeBuilder.Register(
		&NetworkBindingPolicy{}, &NetworkBindingPolicyList{},
		&NetworkRoutingPolicy{}, &NetworkRoutingPolicyList{},
		&ServiceRoutingPolicy{}, &ServiceRoutingPolicyList{},
	)
}
