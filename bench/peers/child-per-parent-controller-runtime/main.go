// child-per-parent with controller-runtime: bench/child-per-parent written
// for controller-runtime, for `cargo xtask bench --stale-reads`. Same
// children (listed from the cache), same annotation written by an update of
// the cached parent, same look again 100 ms after a write, same output line.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr" // bench knob
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller" // bench knob
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

const (
	parentLabel        = "bench.kinformer.dev/parent"
	childrenAnnotation = "bench.kinformer.dev/children"
)

// Reconciler gives every Secret one ConfigMap child and counts its children
// in an annotation.
type Reconciler struct {
	client.Client
}

func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var parent corev1.Secret
	if err := r.Get(ctx, req.NamespacedName, &parent); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var children corev1.ConfigMapList
	if err := r.List(ctx, &children, client.InNamespace(req.Namespace),
		client.MatchingLabels{parentLabel: req.Name}); err != nil {
		return ctrl.Result{}, err
	}
	count, wrote := len(children.Items), false
	if count == 0 {
		child := corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			GenerateName: req.Name + "-",
			Namespace:    req.Namespace,
			Labels:       map[string]string{parentLabel: req.Name},
		}}
		if err := ctrl.SetControllerReference(&parent, &child, r.Scheme()); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.Create(ctx, &child); err != nil {
			return ctrl.Result{}, err
		}
		fmt.Printf("%s/%s: created child %s\n", req.Namespace, req.Name, child.Name)
		count, wrote = 1, true
	}
	if parent.Annotations[childrenAnnotation] != strconv.Itoa(count) {
		metav1.SetMetaDataAnnotation(&parent.ObjectMeta, childrenAnnotation, strconv.Itoa(count))
		if err := r.Update(ctx, &parent); err != nil {
			return ctrl.Result{}, err
		}
		wrote = true
	}
	if wrote {
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	return ctrl.Result{}, nil
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
	// For the benchmark only (lines marked "bench knob"): READ_YOUR_WRITES=true
	// turns on the cached client's experimental EnableReadYourWritesConsistency,
	// MAX_CONCURRENT_RECONCILES sets the workers (default 1).
	workers, _ := strconv.Atoi(os.Getenv("MAX_CONCURRENT_RECONCILES")) // bench knob
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Metrics: metricsserver.Options{BindAddress: "0"},
		Client: client.Options{Cache: &client.CacheOptions{ // bench knob
			EnableReadYourWritesConsistency: ptr.To(os.Getenv("READ_YOUR_WRITES") == "true"), // bench knob
		}}, // bench knob
	})
	must(err, "unable to create the manager")
	must(ctrl.NewControllerManagedBy(mgr).
		For(&corev1.Secret{}).
		Owns(&corev1.ConfigMap{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}). // bench knob
		Complete(&Reconciler{Client: mgr.GetClient()}), "unable to create the controller")
	must(mgr.Start(ctrl.SetupSignalHandler()), "manager stopped")
}
