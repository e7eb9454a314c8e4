package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/lace-cni/lace/internal/fsutil"
	"github.com/lace-cni/lace/internal/podnet"
)

// Endpoint is the agent's record of one pod attachment. The checkpoint is
// the agent's source of truth for what it created on the node: it is
// written before any kernel change, so a crash never hands out an address
// twice and DEL always finds what to remove.
type Endpoint struct {
	// ContainerID is the runtime's sandbox ID; empty for an endpoint
	// rebuilt from the kernel after the checkpoint was lost (the host
	// interface name is a hash of the ID, so DEL, GC and a retried ADD
	// still find it).
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
	// NetNSCookie is the pod's network namespace's cookie when the node's
	// socket hooks are attached (they take the hairpin choice for the
	// pod's sockets); 0 otherwise.
	NetNSCookie uint64 `json:"netnsCookie,omitempty"`
	// L2: an endpoint of an l2 network. Its addresses and PodMAC are
	// lace-controller's (its NetworkEndpoint's status), each address has
	// its subnet's prefix length (PrefixBits), its port runs from_l2, and
	// its host side has the network's anycast gateway MAC (GatewayMAC).
	// A record without (older agents) is an l3 endpoint.
	L2         bool   `json:"l2,omitempty"`
	PrefixBits []int  `json:"prefixBits,omitempty"`
	GatewayMAC string `json:"gatewayMAC,omitempty"`
	// Ready is set once the interface exists: from then on the applier
	// keeps the data plane's entries for it. An endpoint neither Ready nor
	// Deleting is an ADD in progress, which owns its entries.
	Ready bool `json:"ready"`
	// Deleting is set by a DEL: the applier removes the entries, then the
	// DEL removes the interface and the record.
	Deleting bool `json:"deleting,omitempty"`
}

// checkpoint is the set of endpoints, persisted as JSON after each change.
// Endpoints are keyed by their host interface name, which is derived from
// the container ID (podnet.HostIfName): an endpoint rebuilt without its
// container ID is found by the same key as one recorded at ADD.
type checkpoint struct {
	path string
	mu   sync.Mutex
	eps  map[string]*Endpoint // by host interface name
	// lost is set when no usable checkpoint was found at start although
	// one may have existed (a missing or unreadable file): the agent then
	// rebuilds it from the kernel and the API.
	lost bool

	// Group commit: changed counts the changes made to eps, saved those
	// a finished write holds. One write at a time; the changes made while
	// it runs are all written by the next, so a burst of ADDs (each
	// records its endpoint twice) pays a write per round, not two per
	// pod, each of the whole file with two fsyncs, one after the other
	// under mu.
	changed, saved uint64
	saving         bool
	// reserving counts changes made by reserve whose waits have not
	// returned: lookups wait for them as for a write in flight.
	reserving int
	savedCond *sync.Cond // on mu; signalled when a write or a reservation ends
	// write is fsutil.WriteAtomic (tests count and fail writes).
	write func(path string, mode os.FileMode, fill func(io.Writer) error) error
}

const checkpointFile = "endpoints.json"

// loadCheckpoint reads the checkpoint in dir. A missing file is an empty
// checkpoint; a file that does not parse is moved aside (kept for an
// operator) and also starts empty: in both cases the agent adopts what the
// kernel still holds (rebuild.go) instead of refusing to start.
func loadCheckpoint(dir string) (*checkpoint, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	c := &checkpoint{path: filepath.Join(dir, checkpointFile), eps: map[string]*Endpoint{}, write: fsutil.WriteAtomic}
	c.savedCond = sync.NewCond(&c.mu)
	b, err := os.ReadFile(c.path)
	if errors.Is(err, os.ErrNotExist) {
		c.lost = true
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	var list []*Endpoint
	if err := json.Unmarshal(b, &list); err != nil {
		if rerr := os.Rename(c.path, c.path+".corrupt"); rerr != nil {
			return nil, fmt.Errorf("parse checkpoint %s: %w (and move it aside: %v)", c.path, err, rerr)
		}
		c.lost = true
		return c, nil
	}
	for _, e := range list {
		c.eps[hostIfOf(e)] = e
	}
	return c, nil
}

func hostIfOf(e *Endpoint) string {
	if e.HostIf == "" {
		e.HostIf = podnet.HostIfName(e.ContainerID)
	}
	return e.HostIf
}

// commit records a change the caller made to eps (holding mu) and returns
// once a write holds it (flush).
func (c *checkpoint) commit() error {
	c.changed++
	return c.flush(c.changed)
}

// flush returns once a write holds change mine: atomically and durably
// (fsutil.WriteAtomic: a temp file in the same directory, fsync, rename,
// fsync of the directory), so a crash leaves the previous checkpoint or the new one,
// never a torn file, and a change is never reported done before it is on
// disk. While another write runs, it waits for it, and the first waiter
// then writes everything changed meanwhile at once. A failed write fails
// the caller whose write it was; the others try their own. The caller
// holds mu (released while writing).
func (c *checkpoint) flush(mine uint64) error {
	for c.saved < mine {
		if c.saving {
			c.savedCond.Wait()
			continue
		}
		upTo := c.changed
		b, err := c.marshal()
		if err != nil {
			return err
		}
		c.saving = true
		c.mu.Unlock()
		err = c.write(c.path, 0o600, func(w io.Writer) error {
			_, err := w.Write(b)
			return err
		})
		c.mu.Lock()
		c.saving = false
		c.savedCond.Broadcast()
		if err != nil {
			return fmt.Errorf("write checkpoint: %w", err)
		}
		c.saved = max(c.saved, upTo)
	}
	return nil
}

// marshal is the checkpoint's file: its endpoints sorted by host
// interface. The caller holds mu.
func (c *checkpoint) marshal() ([]byte, error) {
	list := make([]*Endpoint, 0, len(c.eps))
	for _, e := range c.eps {
		list = append(list, e)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].HostIf < list[j].HostIf })
	return json.MarshalIndent(list, "", " ")
}

// get returns the endpoint of a container.
func (c *checkpoint) get(containerID string) (Endpoint, bool) {
	return c.byHostIf(podnet.HostIfName(containerID))
}

func (c *checkpoint) byHostIf(hostIf string) (Endpoint, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// What ADD, DEL and CHECK decide on must be on disk: a DEL retried
	// while the first one's removal is being written would otherwise
	// find nothing and report success before the removal could survive
	// a crash. The changes made before the lookup are waited for while a
	// write or a reservation is in flight (the next write holds them
	// all; later changes do not hold the lookup up, so a burst of ADDs
	// cannot starve it); a failed write is not retried here (its caller
	// failed and the runtime retries).
	for target := c.changed; c.saved < target && (c.saving || c.reserving > 0); {
		c.savedCond.Wait()
	}
	e, ok := c.eps[hostIf]
	if !ok {
		return Endpoint{}, false
	}
	return *e, true
}

func (c *checkpoint) put(e Endpoint) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.eps[hostIfOf(&e)] = &e
	return c.commit()
}

// reserve records e at once (used sees its addresses) and returns a wait
// that returns once a write holds it. An ADD picks its addresses and
// reserves them under addLock, and waits for the disk outside it, so ADDs
// at once share writes as puts do; a put under addLock wrote once per ADD,
// one after the other. The wait must be called (until it is, lookups
// wait); a second call only waits again.
func (c *checkpoint) reserve(e Endpoint) (wait func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.eps[hostIfOf(&e)] = &e
	c.changed++
	c.reserving++
	mine := c.changed
	var once sync.Once
	return func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		// Counted until a write held it (or failed): a lookup waking
		// between another write's end and this one's start must still
		// wait for it.
		err := c.flush(mine)
		once.Do(func() {
			c.reserving--
			c.savedCond.Broadcast()
		})
		return err
	}
}

// putAll records several endpoints with one write.
func (c *checkpoint) putAll(eps []Endpoint) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range eps {
		c.eps[hostIfOf(&e)] = &e
	}
	return c.commit()
}

// remove forgets the endpoint on host interface hostIf; a missing one is
// success.
func (c *checkpoint) remove(hostIf string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.eps[hostIf]; !ok {
		return nil
	}
	delete(c.eps, hostIf)
	return c.commit()
}

func (c *checkpoint) all() []Endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Endpoint, 0, len(c.eps))
	for _, e := range c.eps {
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].HostIf < out[j].HostIf })
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
