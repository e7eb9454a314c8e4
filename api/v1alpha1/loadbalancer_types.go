package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AddressRange is a CIDR prefix or an inclusive first-last range of one
// family, such as 192.0.2.10-192.0.2.20.
// +kubebuilder:validation:MaxLength=81
// +kubebuilder:validation:XValidation:rule="isCIDR(self) || (size(self.split('-')) == 2 && isIP(self.split('-')[0]) && isIP(self.split('-')[1]))",message="must be a CIDR (192.0.2.0/28) or a first-last range (192.0.2.10-192.0.2.20)"
// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="must be a network address with no host bits set"
// +kubebuilder:validation:XValidation:rule="!(size(self.split('-')) == 2 && isIP(self.split('-')[0]) && isIP(self.split('-')[1])) || ip(self.split('-')[0]).family() == ip(self.split('-')[1]).family()",message="both ends of a range must be of the same IP family"
// +kubebuilder:validation:XValidation:rule="!(size(self.split('-')) == 2 && isIP(self.split('-')[0]) && isIP(self.split('-')[1]) && ip(self.split('-')[0]).family() == 4 && ip(self.split('-')[1]).family() == 4) || int(self.split('-')[0].split('.')[0]) * 16777216 + int(self.split('-')[0].split('.')[1]) * 65536 + int(self.split('-')[0].split('.')[2]) * 256 + int(self.split('-')[0].split('.')[3]) <= int(self.split('-')[1].split('.')[0]) * 16777216 + int(self.split('-')[1].split('.')[1]) * 65536 + int(self.split('-')[1].split('.')[2]) * 256 + int(self.split('-')[1].split('.')[3])",message="the first address of a range must not be above the last"
type AddressRange string

// LoadBalancerClassSpec is a pool of LoadBalancer VIPs, the nodes that
// may announce them and the namespaces that may use them.
// +kubebuilder:validation:XValidation:rule="!has(self.namespaceSelector) || !has(self.namespaceSelector.matchExpressions) || self.namespaceSelector.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'] && ((e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0)))",message="matchExpressions: operator must be In, NotIn, Exists or DoesNotExist, with values exactly for In and NotIn",fieldPath=".namespaceSelector"
// +kubebuilder:validation:XValidation:rule="!has(self.addressRequestNamespaceSelector) || !has(self.addressRequestNamespaceSelector.matchExpressions) || self.addressRequestNamespaceSelector.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'] && ((e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0)))",message="matchExpressions: operator must be In, NotIn, Exists or DoesNotExist, with values exactly for In and NotIn",fieldPath=".addressRequestNamespaceSelector"
type LoadBalancerClassSpec struct {
	// Addresses are the pool: CIDRs or first-last ranges, of either family.
	// A Service gets one VIP per family it asks for that the pool provides.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	Addresses []AddressRange `json:"addresses"`

	// Default makes this the class of LoadBalancer Services that name none.
	// +optional
	Default bool `json:"default,omitempty"`

	// NodeSelector limits which nodes may announce this class's VIPs;
	// unset selects every node.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// NamespaceSelector says whose Services may get VIPs from this class:
	// those of the namespaces it selects. Unset selects every namespace;
	// an empty selector ({}) does too. A Service of another namespace gets
	// no VIP (a Warning Event, reason NamespaceNotAllowed) and gives back
	// any it held.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// AddressRequestNamespaceSelector says whose Services may ask for a
	// specific VIP (the lace-cni.io/load-balancer-ips annotation or
	// spec.loadBalancerIP): those of the namespaces it selects, among the
	// NamespaceSelector's. Unset: no namespace may; {} selects every one.
	// A Service asking without leave gets no VIP (a Warning Event, reason
	// AddressRequestNotAllowed) and gives back any it held.
	// +optional
	AddressRequestNamespaceSelector *metav1.LabelSelector `json:"addressRequestNamespaceSelector,omitempty"`
}

// LoadBalancerClassStatus reports whether the pool is usable and how full it is.
type LoadBalancerClassStatus struct {
	// Allocated is the number of VIPs handed out from this class.
	// +optional
	Allocated int32 `json:"allocated,omitempty"`
	// Conditions: Ready is False with reason InvalidRange, Overlap or
	// MultipleDefaults when the pool cannot be used as written;
	// AddressesExcluded is True (reason ReservedOverlap) when addresses of
	// the pool are never handed out: node or API server addresses, pod
	// subnets, service ranges, other Services' external IPs.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// LoadBalancerClass is a pool of LoadBalancer VIPs. A Service selects it with
// spec.loadBalancerClass: lace-cni.io/<name>, or gets the default class.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=lbc,categories=lace
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.spec.addresses`
// +kubebuilder:printcolumn:name="Default",type=boolean,JSONPath=`.spec.default`
// +kubebuilder:printcolumn:name="Allocated",type=integer,JSONPath=`.status.allocated`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
type LoadBalancerClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   LoadBalancerClassSpec   `json:"spec"`
	Status LoadBalancerClassStatus `json:"status,omitempty"`
}

// LoadBalancerClassList is a list of LoadBalancerClasses.
//
// +kubebuilder:object:root=true
type LoadBalancerClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LoadBalancerClass `json:"items"`
}

func init() {
	SchemeBuilder.Register(&LoadBalancerClass{}, &LoadBalancerClassList{})
}
