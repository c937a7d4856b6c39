// configmap-hash with controller-runtime: the controller of
// examples/configmap-hash written for controller-runtime, for the
// comparison in docs/controllers.md. Same hash, same patch, same output line.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"strconv" // bench knob

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr" // bench knob
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller" // bench knob
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The field index of Deployments by the ConfigMaps they use.
const configMapIndex = "spec.template.configMaps"

// configMaps returns the names of the ConfigMaps the Deployment's pods use,
// sorted and deduplicated.
func configMaps(d *appsv1.Deployment) []string {
	var names []string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil {
			names = append(names, v.ConfigMap.Name)
		}
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, e := range c.EnvFrom {
			if e.ConfigMapRef != nil {
				names = append(names, e.ConfigMapRef.Name)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// Reconciler stamps a Deployment's pod template with its ConfigMaps' hash.
type Reconciler struct {
	client.Client
}

func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var d appsv1.Deployment
	if err := r.Get(ctx, req.NamespacedName, &d); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	h := fnv.New64a() // over the keys and the data
	for _, name := range configMaps(&d) {
		h.Write([]byte(d.Namespace + "/" + name))
		var cm corev1.ConfigMap
		err := r.Get(ctx, types.NamespacedName{Namespace: d.Namespace, Name: name}, &cm)
		if client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		} else if err == nil {
			var data bytes.Buffer
			enc := json.NewEncoder(&data)
			enc.SetEscapeHTML(false) // as serde_json writes it
			if err := enc.Encode(cm.Data); err != nil {
				return ctrl.Result{}, err
			}
			h.Write(bytes.TrimSuffix(data.Bytes(), []byte("\n")))
		}
	}
	hash := fmt.Sprintf("%016x", h.Sum64())
	if d.Spec.Template.Annotations["kinformer.dev/config-hash"] == hash {
		return ctrl.Result{}, nil
	}
	patch := client.MergeFrom(d.DeepCopy())
	metav1.SetMetaDataAnnotation(&d.Spec.Template.ObjectMeta, "kinformer.dev/config-hash", hash)
	if err := r.Patch(ctx, &d, patch); err != nil {
		return ctrl.Result{}, err
	}
	fmt.Printf("%s/%s: config hash %s\n", d.Namespace, d.Name, hash)
	return ctrl.Result{}, nil
}

// deploymentsUsing maps a ConfigMap to the Deployments that use it.
func (r *Reconciler) deploymentsUsing(ctx context.Context, cm client.Object) []ctrl.Request {
	var list appsv1.DeploymentList
	err := r.List(ctx, &list, client.InNamespace(cm.GetNamespace()),
		client.MatchingFields{configMapIndex: cm.GetName()})
	if err != nil {
		return nil
	}
	requests := make([]ctrl.Request, len(list.Items))
	for i := range list.Items {
		requests[i].NamespacedName = client.ObjectKeyFromObject(&list.Items[i])
	}
	return requests
}

var setupLog = ctrl.Log.WithName("setup")

// must exits if err is not nil, saying what failed.
func must(err error, what string) {
	if err != nil {
		setupLog.Error(err, what)
		os.Exit(1)
	}
}

func main() {
	ctrl.SetLogger(zap.New())
	// Leader election on Lease configmap-hash when LEADER_ELECTION_NAMESPACE
	// names its namespace. For the benchmark only (lines marked "bench
	// knob", which bench/peers/count-lines.sh does not count):
	// ENABLE_WARMUP=true starts a standby's sources,
	// MAX_CONCURRENT_RECONCILES sets the workers (default 1), and
	// READ_YOUR_WRITES=true turns on the cached client's experimental
	// EnableReadYourWritesConsistency.
	namespace := os.Getenv("LEADER_ELECTION_NAMESPACE")
	workers, _ := strconv.Atoi(os.Getenv("MAX_CONCURRENT_RECONCILES")) // bench knob
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		LeaderElection:          namespace != "",
		LeaderElectionID:        "configmap-hash",
		LeaderElectionNamespace: namespace,
		// No metrics server, as kubebuilder's scaffold (--metrics-bind-address
		// "0") and kinformer's Manager default: replicas share a host here.
		Metrics: metricsserver.Options{BindAddress: "0"},
		Client: client.Options{Cache: &client.CacheOptions{ // bench knob
			EnableReadYourWritesConsistency: ptr.To(os.Getenv("READ_YOUR_WRITES") == "true"), // bench knob
		}}, // bench knob
	})
	must(err, "unable to create the manager")
	ctx := ctrl.SetupSignalHandler()
	must(mgr.GetFieldIndexer().IndexField(ctx, &appsv1.Deployment{}, configMapIndex,
		func(o client.Object) []string { return configMaps(o.(*appsv1.Deployment)) }),
		"unable to index Deployments")
	r := &Reconciler{Client: mgr.GetClient()}
	must(ctrl.NewControllerManagedBy(mgr).
		For(&appsv1.Deployment{}).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.deploymentsUsing)).
		WithOptions(controller.Options{ // bench knob
			EnableWarmup:            ptr.To(os.Getenv("ENABLE_WARMUP") == "true"), // bench knob
			MaxConcurrentReconciles: workers,                                      // bench knob
		}). // bench knob
		Complete(r), "unable to create the controller")
	must(mgr.Start(ctx), "manager stopped")
}
