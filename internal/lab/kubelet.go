package lab

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/controlplane"
)

// kubelet is the lab's stand-in for a node's kubelet and container runtime.
type kubelet struct {
	cfg     Config
	index   int
	node    string
	zone    string
	nodeNS  string
	client  kubernetes.Interface
	cni     *NodeCNI
	dataDir string
	apiPort int
	log     *slog.Logger

	nodeHTTP *http.Client
	lister   corelisters.PodLister
	queue    workqueue.TypedRateLimitingInterface[string]

	mu   sync.Mutex
	pods map[string]*pod // by pod key (namespace/name)

	statusMu  sync.Mutex
	statusDue map[string]bool
	statusCh  chan struct{}

	recorder record.EventRecorder
}

func newKubelet(cfg Config, i int, client kubernetes.Interface, apiPort int, log *slog.Logger) *kubelet {
	node := cfg.NodeName(i)
	dataDir := filepath.Join(cfg.StateDir(), "nodes", node)
	k := &kubelet{
		cfg: cfg, index: i, node: node, zone: cfg.Zone(i), nodeNS: cfg.NetNS(node),
		client: client, dataDir: dataDir, apiPort: apiPort, log: log.With("node", node),
		pods: map[string]*pod{}, statusDue: map[string]bool{}, statusCh: make(chan struct{}, 1),
	}
	k.cni = NewNodeCNI(k.nodeNS, filepath.Join(dataDir, "net.d"), filepath.Join(dataDir, "cni-cache"), []string{cfg.CNIBinDir, cfg.cniPluginDir()})
	k.nodeHTTP = nodeHTTPClient(k.nodeNS)
	bc := record.NewBroadcaster()
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	k.recorder = bc.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "kubelet", Host: node})
	return k
}

func (k *kubelet) agnhost() string { return filepath.Join(k.cfg.K8sBinDir, "agnhost") }
func (k *kubelet) binDir() string  { return filepath.Join(k.cfg.StateDir(), "bin") }

// run registers the node, keeps its lease fresh and runs the pods bound to
// it until ctx ends; then it stops every pod it runs.
func (k *kubelet) run(ctx context.Context) error {
	if err := k.register(ctx); err != nil {
		return err
	}
	go k.heartbeat(ctx)

	factory := informers.NewSharedInformerFactoryWithOptions(k.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + k.node }))
	inf := factory.Core().V1().Pods()
	k.lister = inf.Lister()
	k.queue = workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("watch pods: %w", err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return fmt.Errorf("pod cache of node %s did not sync", k.node)
	}
	go k.statusLoop(ctx)
	go k.garbageCollect(ctx)
	workers := sync.WaitGroup{}
	for range 4 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for k.processNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	k.queue.ShutDown()
	workers.Wait()
	k.stopAll()
	return nil
}

// stopAll stops every pod of the node (used when the lab goes down).
func (k *kubelet) stopAll() {
	k.mu.Lock()
	pods := make([]*pod, 0, len(k.pods))
	for _, p := range k.pods {
		pods = append(pods, p)
	}
	k.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p.mu.Lock()
			zero := int64(1)
			p.spec.DeletionGracePeriodSeconds = &zero
			p.mu.Unlock()
			if err := p.stop(ctx); err != nil {
				k.log.Error("stop pod", "pod", p.key(), "err", err)
			}
		}()
	}
	wg.Wait()
}

func (k *kubelet) processNext(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil {
		k.log.Info("pod sync failed, retrying", "pod", key, "err", err)
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

// sync drives one pod toward its spec: start it, keep it, or stop it and
// finish its deletion.
func (k *kubelet) sync(ctx context.Context, key string) error {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	obj, err := k.lister.Pods(ns).Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	k.mu.Lock()
	p := k.pods[key]
	k.mu.Unlock()

	// Gone from the API, or replaced by a new pod of the same name.
	if p != nil && (obj == nil || string(obj.UID) != p.uid) {
		if err := p.stop(ctx); err != nil {
			return fmt.Errorf("stop %s: %w", key, err)
		}
		k.forget(key, p)
		p = nil
	}
	if obj == nil {
		return nil
	}
	if obj.DeletionTimestamp != nil {
		if p != nil {
			p.update(obj)
			if err := p.stop(ctx); err != nil {
				return fmt.Errorf("stop %s: %w", key, err)
			}
			k.forget(key, p)
			k.log.Info("pod stopped", "pod", key)
		}
		// Finish the graceful deletion, as kubelet does once the pod's
		// containers and sandbox are gone.
		err := k.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &obj.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("finish deletion of %s: %w", key, err)
		}
		return nil
	}
	if obj.Status.Phase == corev1.PodSucceeded || obj.Status.Phase == corev1.PodFailed {
		if p == nil {
			return nil
		}
	}
	if p == nil {
		p = &pod{k: k, uid: string(obj.UID), ns: ns, nm: name, spec: obj.DeepCopy(),
			dir: filepath.Join(k.dataDir, "pods", string(obj.UID))}
		k.mu.Lock()
		k.pods[key] = p
		k.mu.Unlock()
	} else {
		p.update(obj)
	}
	if !p.started() {
		if err := p.start(ctx); err != nil {
			k.recorder.Eventf(obj, corev1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
			return err
		}
		k.log.Info("pod started", "pod", key)
	}
	return nil
}

func (k *kubelet) forget(key string, p *pod) {
	k.mu.Lock()
	if k.pods[key] == p {
		delete(k.pods, key)
	}
	k.mu.Unlock()
}

// podByKey returns the running pod namespace/name, or nil.
func (k *kubelet) podByKey(key string) *pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.pods[key]
}

// statusChanged schedules a status update of p.
func (k *kubelet) statusChanged(p *pod) {
	k.statusMu.Lock()
	k.statusDue[p.key()] = true
	k.statusMu.Unlock()
	select {
	case k.statusCh <- struct{}{}:
	default:
	}
}

// statusLoop writes pod statuses, coalescing bursts of changes.
func (k *kubelet) statusLoop(ctx context.Context) {
	resync := time.NewTicker(10 * time.Second)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.statusCh:
		case <-resync.C:
			k.mu.Lock()
			for key := range k.pods {
				k.statusMu.Lock()
				k.statusDue[key] = true
				k.statusMu.Unlock()
			}
			k.mu.Unlock()
		}
		k.statusMu.Lock()
		due := k.statusDue
		k.statusDue = map[string]bool{}
		k.statusMu.Unlock()
		for key := range due {
			if p := k.podByKey(key); p != nil {
				if err := k.writeStatus(ctx, p); err != nil && ctx.Err() == nil {
					k.log.Info("pod status update failed, retrying", "pod", key, "err", err)
					k.statusChanged(p)
				}
			}
		}
	}
}

func (k *kubelet) writeStatus(ctx context.Context, p *pod) error {
	cur, err := k.client.CoreV1().Pods(p.ns).Get(ctx, p.nm, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if string(cur.UID) != p.uid || cur.DeletionTimestamp != nil {
		return nil
	}
	p.update(cur)
	st := p.status(cur.Status)
	if equality.Semantic.DeepEqual(cur.Status, st) {
		return nil
	}
	cur.Status = st
	_, err = k.client.CoreV1().Pods(p.ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	return err
}

// register creates or refreshes the Node object.
func (k *kubelet) register(ctx context.Context) error {
	labels := map[string]string{
		corev1.LabelHostname:       k.node,
		corev1.LabelOSStable:       "linux",
		corev1.LabelArchStable:     "amd64",
		corev1.LabelTopologyZone:   k.zone,
		corev1.LabelTopologyRegion: "lab",
		"lace-cni.io/lab":          k.cfg.Name,
	}
	// Node controllers in kube-controller-manager touch new nodes at once:
	// retry on conflicts with the latest object.
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		node, err := k.client.CoreV1().Nodes().Get(ctx, k.node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			node, err = k.client.CoreV1().Nodes().Create(ctx, &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: k.node, Labels: labels},
			}, metav1.CreateOptions{})
		}
		if err != nil {
			return fmt.Errorf("register node %s: %w", k.node, err)
		}
		k.fillStatus(node)
		if _, err := k.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("report status of node %s: %w", k.node, err)
		}
		return nil
	})
}

// fillStatus sets everything the kubelet reports about its node.
func (k *kubelet) fillStatus(node *corev1.Node) {
	v4, v6 := NodeUnderlay(k.index)
	res := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("8"),
		corev1.ResourceMemory:           resource.MustParse("16Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	node.Status.Capacity, node.Status.Allocatable = res, res
	node.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: v4.String()},
		{Type: corev1.NodeInternalIP, Address: v6.String()},
		{Type: corev1.NodeHostName, Address: k.node},
		// The API server reaches this kubelet on loopback (it is told to
		// prefer InternalDNS): nothing routes into the lab from the root
		// namespace.
		{Type: corev1.NodeInternalDNS, Address: "localhost"},
	}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(k.apiPort)
	node.Status.NodeInfo = corev1.NodeSystemInfo{
		KubeletVersion:  controlplane.K8sVersion,
		OperatingSystem: "linux", Architecture: "amd64",
		ContainerRuntimeVersion: "lace-lab://" + controlplane.K8sVersion,
		OSImage:                 "lace lab node", MachineID: k.cfg.Name + "-" + k.node, SystemUUID: k.cfg.Name + "-" + k.node,
	}
	k.setConditions(node)
}

func (k *kubelet) setConditions(node *corev1.Node) {
	now := metav1.Now()
	set := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) {
		for i := range node.Status.Conditions {
			c := &node.Status.Conditions[i]
			if c.Type == t {
				if c.Status != s {
					c.LastTransitionTime = now
				}
				c.Status, c.Reason, c.Message, c.LastHeartbeatTime = s, reason, msg, now
				return
			}
		}
		node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{
			Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now,
		})
	}
	set(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "lab kubelet is posting ready status")
	set(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "")
	set(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "")
	set(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "")
}

// heartbeat renews the node Lease every 10s and the Ready condition every
// minute, as kubelet does.
func (k *kubelet) heartbeat(ctx context.Context) {
	leases := k.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	lastStatus := time.Now()
	for {
		now := metav1.NewMicroTime(time.Now())
		l, err := leases.Get(ctx, k.node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			node, gerr := k.client.CoreV1().Nodes().Get(ctx, k.node, metav1.GetOptions{})
			if gerr == nil {
				_, err = leases.Create(ctx, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Name: k.node, OwnerReferences: []metav1.OwnerReference{{
						APIVersion: "v1", Kind: "Node", Name: k.node, UID: node.UID,
					}}},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: &k.node, LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
				}, metav1.CreateOptions{})
			}
		case err == nil:
			l.Spec.RenewTime = &now
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			k.log.Info("renew node lease failed", "err", err)
		}
		if time.Since(lastStatus) > time.Minute {
			if node, err := k.client.CoreV1().Nodes().Get(ctx, k.node, metav1.GetOptions{}); err == nil {
				k.setConditions(node)
				if _, err := k.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err == nil {
					lastStatus = time.Now()
				}
			}
		}
		if !sleepCtx(ctx, 10*time.Second) {
			return
		}
	}
}

// lookup finds a running pod by namespace/name and, when given, UID.
func (k *kubelet) lookup(ns, name string, uid types.UID) (*pod, error) {
	p := k.podByKey(ns + "/" + name)
	if p == nil || (uid != "" && string(uid) != p.uid) {
		return nil, fmt.Errorf("pod %s/%s is not running on node %s", ns, name, k.node)
	}
	return p, nil
}

// garbageCollect runs CNI GC every two minutes with the pods the kubelet
// runs, as container runtimes do, so attachments whose DEL was lost do not
// linger.
func (k *kubelet) garbageCollect(ctx context.Context) {
	for sleepCtx(ctx, 2*time.Minute) {
		k.mu.Lock()
		valid := make([]string, 0, len(k.pods))
		for _, p := range k.pods {
			if !p.snapshot().Spec.HostNetwork {
				valid = append(valid, p.uid)
			}
		}
		k.mu.Unlock()
		gcCtx, cancel := context.WithTimeout(ctx, time.Minute)
		if err := k.cni.GC(gcCtx, valid); err != nil && ctx.Err() == nil {
			k.log.Info("CNI GC failed", "err", err)
		}
		cancel()
	}
}
