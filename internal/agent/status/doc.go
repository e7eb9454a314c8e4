// Package status tells the cluster what the node can do: its health
// (health.go: attached, an IPv6 underlay, other nodes' locators
// reachable), the UnderlayEndpoint's data plane summary and Ready
// condition with Events on the Node (status.go), the data plane's
// counters as metrics (metrics.go), and the healthCheckNodePorts of
// externalTrafficPolicy Local services (healthcheck.go).
//
// It owns the last condition reported and the health check servers. It
// only reads: the node's sync through Sync, the kernel through Kernel,
// the maps through Maps and Counters; it must not write the data plane,
// the node's routes or the pods' checkpoint.
package status
