// Package model turns API objects into the desired state of Lace's
// components: which network a pod or service binds to, and what a node's
// data plane must hold (networks, routes to every node's blocks, known node
// addresses, underlay routes to other nodes' locators). ComputeDesired
// assembles a node's whole desired state from those pieces, for the agent
// and lacectl alike. It is pure: no I/O, no kernel, no API calls, so every
// decision is unit-tested.
package model
