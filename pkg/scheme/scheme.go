// Package scheme is the runtime.Scheme every Lace binary uses: the core
// Kubernetes kinds plus lace-cni.io/v1alpha1.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// Scheme knows the core kinds and the lace-cni.io kinds.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(lacev1.AddToScheme(Scheme))
}
