package status

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/cilium/ebpf"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// nodeHealth is whether the node can carry pod traffic: reason is empty
// when it can, else the first problem's reason (lacev1.Reason*), and
// message names every problem. Messages are stable while the problem
// lasts: the condition built from them is written only when it changes.
type nodeHealth struct {
	reason, message string
}

func (h nodeHealth) ok() bool { return h.reason == "" }

// checkHealth looks at the node as it is now, locally (netlink, and the
// last apply): no API call. A node that cannot carry pod traffic says so
// through its UnderlayEndpoint's Ready condition, an Event on its Node and
// CNI STATUS, instead of starting pods that cannot talk.
func (r *Reporter) checkHealth() nodeHealth {
	type problem struct{ reason, msg string }
	var ps []problem
	attachErr := r.sync.AttachErr()
	st := r.sync.State()
	if attachErr != nil {
		if errors.Is(attachErr, ebpf.ErrNotSupported) {
			ps = append(ps, problem{lacev1.ReasonKernelFeatureMissing,
				fmt.Sprintf("the kernel cannot attach the data plane to %s (tcx, Linux 6.6 or later): %v", r.opts.UnderlayInterface, attachErr)})
		} else {
			ps = append(ps, problem{lacev1.ReasonDatapathAttachFailed,
				fmt.Sprintf("attaching the data plane to %s failed: %v", r.opts.UnderlayInterface, attachErr)})
		}
	}
	addrs, err := r.node.UnderlayAddrs()
	hasV6 := false
	for _, ad := range addrs {
		hasV6 = hasV6 || (ad.Is6() && !ad.Is4In6())
	}
	switch {
	case err != nil:
		ps = append(ps, problem{lacev1.ReasonNoIPv6Underlay, fmt.Sprintf("cannot read the addresses of %s: %v", r.opts.UnderlayInterface, err)})
	case !hasV6:
		ps = append(ps, problem{lacev1.ReasonNoIPv6Underlay,
			fmt.Sprintf("%s has no global IPv6 address: SRv6 to and from other nodes is impossible", r.opts.UnderlayInterface)})
	}
	var unreachable []string
	for _, lr := range st.LocatorRoutes {
		if err := r.node.Reachable(lr.Via); err != nil {
			unreachable = append(unreachable, fmt.Sprintf("%s (locator %s via %s)", lr.Node, lr.Locator, lr.Via))
		}
	}
	if len(unreachable) > 0 {
		sort.Strings(unreachable)
		ps = append(ps, problem{lacev1.ReasonLocatorUnreachable,
			fmt.Sprintf("no route out of %s to node %s", r.opts.UnderlayInterface, strings.Join(unreachable, ", "))})
	}
	if len(ps) == 0 {
		return nodeHealth{}
	}
	msgs := make([]string, 0, len(ps))
	for _, p := range ps {
		msgs = append(msgs, p.msg)
	}
	return nodeHealth{reason: ps[0].reason, message: strings.Join(msgs, "; ")}
}
