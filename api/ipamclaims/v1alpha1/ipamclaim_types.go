package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPAMClaimSpec names the network and interface whose addresses the claim
// keeps.
type IPAMClaimSpec struct {
	// Network is the name of the network the addresses belong to (for
	// Lace, a Network of type l2).
	Network string `json:"network"`
	// Interface is the pod interface the addresses are for.
	Interface string `json:"interface"`
	// IPRequests are addresses asked for (CIDR notation), kept from then on.
	// +optional
	IPRequests []string `json:"ipRequests,omitempty"`
}

// IPAMClaimStatus is what the IPAM allocated for the claim.
type IPAMClaimStatus struct {
	// IPs are the claimed addresses, in CIDR notation (address and the
	// network's prefix length).
	// +optional
	IPs []string `json:"ips,omitempty"`
	// OwnerPod is the pod the addresses are in use by.
	// +optional
	OwnerPod *OwnerPod `json:"ownerPod,omitempty"`
	// Conditions of the claim.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// OwnerPod names a pod of the claim's namespace.
type OwnerPod struct {
	Name string `json:"name"`
}

// IPAMClaim keeps a workload's addresses in a network across its pods.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced
type IPAMClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   IPAMClaimSpec   `json:"spec,omitempty"`
	Status IPAMClaimStatus `json:"status,omitempty"`
}

// IPAMClaimList is a list of IPAMClaims.
//
// +kubebuilder:object:root=true
type IPAMClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPAMClaim `json:"items"`
}

func init() {
	SchemeBuilder.Register(&IPAMClaim{}, &IPAMClaimList{})
}
