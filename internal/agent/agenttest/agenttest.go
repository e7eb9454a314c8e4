// Package agenttest holds what the agent's parts' tests share: the API of
// a node with one l3 network, and the helpers of their in-memory fakes.
// Only tests import it.
package agenttest

import (
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// World is the API of a node with the default network.
type World struct {
	Network    *lacev1.Network
	Allocation *lacev1.Allocation
	// Objects are the default namespace, the node, the network, its
	// allocation and a catch-all binding policy.
	Objects []client.Object
}

// DefaultNetwork is the default l3 network (10.244.0.0/16, ID 1) with
// block 10.244.0.0/blockBits on node.
func DefaultNetwork(node string, blockBits int32) World {
	nw := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL3,
			IPv4Subnet: &lacev1.Subnet{Prefix: "10.244.0.0/16", HostLocalPrefixLength: ptr.To(blockBits)}},
		Status: lacev1.NetworkStatus{ID: 1}}
	alloc := &lacev1.Allocation{ObjectMeta: metav1.ObjectMeta{Name: "default." + node},
		Spec: lacev1.AllocationSpec{Network: "default", Node: node, Prefixes: []lacev1.CIDR{lacev1.CIDR(fmt.Sprintf("10.244.0.0/%d", blockBits))}}}
	return World{Network: nw, Allocation: alloc, Objects: []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}},
		nw, alloc,
		&lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
			Spec: lacev1.NetworkBindingPolicySpec{Network: "default", Priority: model.CatchAllPriority}},
	}}
}

// State is the node's desired state in w, as ComputeNode makes it.
func (w World) State(node string) model.NodeState {
	return model.ComputeNode(model.NodeInput{Node: node, Networks: []lacev1.Network{*w.Network},
		Allocations: []lacev1.Allocation{*w.Allocation}})
}

// Values are m's values, read under mu.
func Values[K comparable, V any](mu *sync.Mutex, m map[K]V) []V {
	mu.Lock()
	defer mu.Unlock()
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// Keys are m's keys, read under mu.
func Keys[K comparable](mu *sync.Mutex, m map[K]bool) []K {
	mu.Lock()
	defer mu.Unlock()
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
