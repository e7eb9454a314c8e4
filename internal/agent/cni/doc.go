// Package cni is the node's pod attachments: the server lace-cni talks to
// on the agent's unix socket (ADD, DEL, CHECK, GC, STATUS), the address
// allocation from the node's blocks (ipam.go), the checkpoint of every
// attachment (checkpoint.go, the source of truth for what the agent made
// on the node), the pods' entries in the data plane (endpoints.go:
// endpoints, ports and their programs, written by the applier's sync),
// their NetworkEndpoints, recovery after a crash or a lost checkpoint
// (recover.go), and install-cni (installcni.go).
//
// It owns the checkpoint and the pods' entries. It must not touch the
// node's other tables, routes or the UnderlayEndpoint (nodesync's), nor
// decide the node's health (status's): it reads the node's state, asks
// for syncs and reads the health through the Node and Health interfaces,
// and reaches the kernel only through Tables and Kernel. It imports no
// other part of the agent but the applier's diff.
package cni
