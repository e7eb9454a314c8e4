// Package v1alpha1 holds the IPAMClaim kind of k8s.cni.cncf.io/v1alpha1,
// the de-facto standard of the Network Plumbing Working Group for
// addresses that outlive a pod: KubeVirt (its ipam-extensions) writes one
// per virtual machine interface, owned by the VM, and the CNI's IPAM keeps
// the addresses it records for every pod that names the claim. Lace reads
// and writes it as OVN-Kubernetes does; the types here follow the
// upstream schema field for field (the upstream Go module is not served
// here), and the chart installs the CRD only where it is absent.
//
// +kubebuilder:object:generate=true
// +groupName=k8s.cni.cncf.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is k8s.cni.cncf.io/v1alpha1.
	GroupVersion = schema.GroupVersion{Group: "k8s.cni.cncf.io", Version: "v1alpha1"}

	// SchemeBuilder registers IPAMClaim with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds IPAMClaim to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
