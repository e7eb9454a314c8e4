package model

import (
	"fmt"
	"math"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// Binding is the outcome of NetworkBindingPolicy evaluation.
type Binding struct {
	Network string
	Policy  string
}

// Bind returns the network a resource of kind (Pod or Service) with the
// given labels, in a namespace with nsLabels, binds to: the matching policy
// with the lowest priority, ties broken by name. It fails when no policy
// matches, naming the resource.
func Bind(policies []lacev1.NetworkBindingPolicy, kind lacev1.MatchKind, namespace, name string,
	objLabels, nsLabels map[string]string) (Binding, error) {
	sorted := append([]lacev1.NetworkBindingPolicy(nil), policies...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Spec.Priority != sorted[j].Spec.Priority {
			return sorted[i].Spec.Priority < sorted[j].Spec.Priority
		}
		return sorted[i].Name < sorted[j].Name
	})
	for _, p := range sorted {
		if p.DeletionTimestamp != nil {
			continue
		}
		if p.Spec.MatchKind != "" && p.Spec.MatchKind != kind {
			continue
		}
		ok, err := selects(p.Spec.NamespaceSelector, nsLabels)
		if err != nil {
			return Binding{}, fmt.Errorf("NetworkBindingPolicy %s: namespaceSelector: %w", p.Name, err)
		}
		if !ok {
			continue
		}
		if ok, err = selects(p.Spec.Selector, objLabels); err != nil {
			return Binding{}, fmt.Errorf("NetworkBindingPolicy %s: selector: %w", p.Name, err)
		}
		if ok {
			return Binding{Network: p.Spec.Network, Policy: p.Name}, nil
		}
	}
	return Binding{}, fmt.Errorf("no NetworkBindingPolicy matches %s %s/%s", kindWord(kind), namespace, name)
}

func kindWord(k lacev1.MatchKind) string {
	if k == lacev1.MatchKindService {
		return "service"
	}
	return "pod"
}

// selects treats a nil or empty selector as matching everything.
func selects(sel *metav1.LabelSelector, l map[string]string) (bool, error) {
	if sel == nil {
		return true, nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false, err
	}
	return s.Matches(labels.Set(l)), nil
}

// CatchAllPriority is the priority of the catch-all policy an install
// ships: every other policy takes precedence over it.
const CatchAllPriority = math.MaxInt32
