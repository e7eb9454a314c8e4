// Package controller holds lace-controller's reconcilers: network IDs, the
// l3 node blocks (Allocations), the nodes' SRv6 locators and the l2
// networks' global IPAM (Neighbors and FDBEntries). It is the single writer
// of those cluster-wide decisions. It never touches a node's kernel and
// never writes the fields agents own (UnderlayEndpoint addresses and zone,
// a NetworkEndpoint's spec: of an l2 endpoint it writes only the status,
// what it assigned).
//
// Every allocation decision is made by one reconcile at a time (one worker
// per kind) from a fresh, uncached list of what is already allocated, so a
// stale cache can never hand out the same block, ID or locator twice; leader
// election keeps a second controller from deciding at the same time.
package controller

// The labels, annotations and finalizers the controller writes are in
// api/v1alpha1 (keys.go).

// FieldManager is the server-side-apply field manager of the controller.
const FieldManager = "lace-controller"

// Condition types and reasons written by the controller.
const (
	ConditionBlocksAllocated = "BlocksAllocated"

	ReasonAllocated          = "Allocated"
	ReasonSubnetExhausted    = "SubnetExhausted"
	ReasonNotRouted          = "NotRouted"
	ReasonIDAssigned         = "IDAssigned"
	ReasonIDsExhausted       = "NetworkIDsExhausted"
	ReasonLocatorsExhausted  = "LocatorPoolExhausted"
	ReasonNetworkNotFound    = "NetworkNotFound"
	ReasonNetworkFound       = "NetworkFound"
	ReasonDuplicateNetworkID = "DuplicateNetworkID"
)
