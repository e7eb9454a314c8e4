// Package v1alpha1 holds the lace-cni.io/v1alpha1 API: the kinds operators
// write (Network, NetworkBindingPolicy, NetworkRoutingPolicy,
// ServiceRoutingPolicy, LoadBalancerClass) and the kinds Lace writes to
// record what it decided (Allocation, UnderlayEndpoint, NetworkEndpoint,
// Neighbor, FDBEntry).
//
// Every rule that can be checked from one object alone is a CEL rule on the
// CRD, so `kubectl apply` of bad input fails with a message naming the field.
// What needs other objects (overlaps, exhaustion) becomes a status condition
// and an Event, written by the controller.
//
// +kubebuilder:object:generate=true
// +groupName=lace-cni.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "lace-cni.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the kinds of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Condition types and reasons shared by several kinds.
const (
	// ConditionReady is True when the object is fully realised.
	ConditionReady = "Ready"
)
