// Package nodesync keeps the node's data plane equal to its desired
// state: the controller's watches (watch.go), the informers' event feeds
// that tell the computation which Services, EndpointSlices and
// NetworkEndpoints changed (svcmirror.go, nepending.go), the computation
// of the node's state from the cache (sync.go, with the incremental
// service cache, svccache.go, the Services' budget, budget.go, and the hostPorts
// with the node's listeners and reserved ports, hostports.go,
// listeners.go, localports.go), the cache transforms of what it reads
// (cachetrim.go), the UnderlayEndpoint it publishes, and the apply: the
// node's tables and views (synced through datapath's table reconciler,
// which keeps the mirrors of what was written), the services' table
// (dpstate.go), and the underlay routes to other nodes. It runs the applier, the one
// writer of the data plane.
//
// It owns the node's desired state and the caches of its computation. It must not touch the pods' entries or their
// checkpoint (cni's: it calls Pods.SyncEntries and the reconcile's pod
// steps), the L2 announcements (announce's) or the status (status's: it
// only kicks a report). It reaches the kernel only through DataPlane and
// Kernel.
package nodesync
