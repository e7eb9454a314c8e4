package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"sync"
)

// Endpoint is the agent's record of one pod attachment. The checkpoint is
// the agent's source of truth for what it created on the node: it is
// written before any kernel change, so a crash never hands out an address
// twice and DEL always finds what to remove.
type Endpoint struct {
	ContainerID string       `json:"containerID"`
	IfName      string       `json:"ifName"`
	NetNS       string       `json:"netns"`
	PodNS       string       `json:"podNamespace"`
	PodName     string       `json:"podName"`
	PodUID      string       `json:"podUID"`
	Network     string       `json:"network"`
	NetID       uint32       `json:"netID"`
	Addrs       []netip.Addr `json:"addrs"`
	Gateways    []netip.Addr `json:"gateways"`
	HostIf      string       `json:"hostIf"`
	HostIfIndex int          `json:"hostIfIndex"`
	HostMAC     string       `json:"hostMAC"`
	PodMAC      string       `json:"podMAC"`
	// Ready is set once the interface and data plane are programmed.
	Ready bool `json:"ready"`
}

// checkpoint is the set of endpoints, persisted as JSON after each change.
type checkpoint struct {
	path string
	mu   sync.Mutex
	eps  map[string]*Endpoint // by container ID
}

func loadCheckpoint(dir string) (*checkpoint, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	c := &checkpoint{path: filepath.Join(dir, "endpoints.json"), eps: map[string]*Endpoint{}}
	b, err := os.ReadFile(c.path)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	var list []*Endpoint
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("parse checkpoint %s: %w", c.path, err)
	}
	for _, e := range list {
		c.eps[e.ContainerID] = e
	}
	return c, nil
}

// save writes the checkpoint atomically; the caller holds mu.
func (c *checkpoint) save() error {
	list := make([]*Endpoint, 0, len(c.eps))
	for _, e := range c.eps {
		list = append(list, e)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].ContainerID < list[j].ContainerID })
	b, err := json.MarshalIndent(list, "", " ")
	if err != nil {
		return err
	}
	tmp := c.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if err := os.Rename(tmp, c.path); err != nil {
		return fmt.Errorf("replace checkpoint: %w", err)
	}
	return nil
}

func (c *checkpoint) get(id string) (Endpoint, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.eps[id]
	if !ok {
		return Endpoint{}, false
	}
	return *e, true
}

func (c *checkpoint) put(e Endpoint) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.eps[e.ContainerID] = &e
	return c.save()
}

func (c *checkpoint) remove(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.eps[id]; !ok {
		return nil
	}
	delete(c.eps, id)
	return c.save()
}

func (c *checkpoint) all() []Endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Endpoint, 0, len(c.eps))
	for _, e := range c.eps {
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ContainerID < out[j].ContainerID })
	return out
}

// used returns the addresses held by the node's endpoints, whatever their
// network. Networks may overlap, but the node itself has one route per pod
// address (kubelet probes): an address is never given to a second pod on
// the node, even in another network.
func (c *checkpoint) used() map[netip.Addr]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[netip.Addr]bool{}
	for _, e := range c.eps {
		for _, a := range e.Addrs {
			out[a] = true
		}
	}
	return out
}
