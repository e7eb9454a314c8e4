// Package announce is the node's share of the L2 announcements of
// LoadBalancer VIPs: it renews the agent's heartbeat Lease, sees which
// agents are alive, decides with model.Announcements which VIPs are this
// node's, has the data plane answer ARP/NDP for them and announces each
// one it takes over.
//
// It owns the Lease bookkeeping and the set of VIPs announced. It must not
// touch the data plane beyond DataPlane.SetAnnounced, and reads Services
// through ServiceLister (the node sync's cache), never copies of its own.
package announce
