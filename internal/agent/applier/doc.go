// Package applier is the one writer of a node's data plane: CNI ADD and
// DEL and the node's reconciler record what they want and ask it to sync;
// it runs one sync at a time and serves every request that arrived during
// a sync with the next one. SyncList and its kin are the diff the syncs
// use against what the kernel holds.
//
// It owns only its queue of waiters. It must not know what a sync writes:
// the sync function is given to New (nodesync's), and it imports nothing
// of the agent.
package applier
