// client-go's side of `cargo xtask bench`: the same scenarios, arguments and
// JSON output as kinformer-bench, on client-go v0.37.2.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

func statusKB(field string) uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, field) {
			parts := strings.Fields(line)
			if len(parts) > 1 {
				v, _ := strconv.ParseUint(parts[1], 10, 64)
				return v
			}
		}
	}
	return 0
}

func emit(v map[string]any) {
	v["system"] = "client-go"
	out, _ := json.Marshal(v)
	fmt.Println(string(out))
}

func atoi(s string) int {
	v, err := strconv.Atoi(s)
	if err != nil {
		fmt.Fprintf(os.Stderr, "not a number: %q\n", s)
		os.Exit(2)
	}
	return v
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: client-go-peer SCENARIO ARGS...")
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "workqueue":
		runWorkqueue(uint64(atoi(args[0])), uint64(atoi(args[1])))
	case "ratelimited":
		runRateLimited(uint64(atoi(args[0])), atoi(args[1]))
	case "fifo":
		runFifo(atoi(args[0]))
	case "real-fifo":
		runRealFifo(atoi(args[0]))
	case "sync":
		runSync(args[0], args[1], !hasArg(args[2:], "keep-managed-fields"), hasArg(args[2:], "json"))
	case "latency":
		runLatency(args[0], args[1], atoi(args[2]))
	case "metadata-sync":
		runMetadataSync(args[0], args[1], len(args) > 2 && args[2] == "json")
	case "decode":
		runDecode(args[0], atoi(args[1]), !hasArg(args[2:], "keep-managed-fields"))
	default:
		fmt.Fprintf(os.Stderr, "unknown scenario %q\n", os.Args[1])
		os.Exit(2)
	}
}

func runWorkqueue(keys, adds uint64) {
	q := workqueue.NewTyped[uint64]()
	var processed atomic.Uint64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k, shutdown := q.Get()
				if shutdown {
					return
				}
				processed.Add(1)
				q.Done(k)
			}
		}()
	}
	for i := uint64(0); i < adds; i++ {
		// Every other add repeats the previous key: 50% duplicates.
		q.Add((i / 2) % keys)
	}
	q.ShutDownWithDrain()
	wg.Wait()
	secs := time.Since(start).Seconds()
	emit(map[string]any{"scenario": "workqueue", "adds": adds, "processed": processed.Load(), "seconds": secs, "adds_per_sec": float64(adds) / secs})
}

func runRateLimited(keys uint64, rounds int) {
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[uint64](time.Hour, 2*time.Hour)
	q := workqueue.NewTypedRateLimitingQueue[uint64](limiter)
	start := time.Now()
	for r := 0; r < rounds; r++ {
		for k := uint64(0); k < keys; k++ {
			q.AddRateLimited(k)
		}
		for k := uint64(0); k < keys; k++ {
			q.Forget(k)
		}
	}
	secs := time.Since(start).Seconds()
	ops := 2 * keys * uint64(rounds)
	q.ShutDown()
	emit(map[string]any{"scenario": "ratelimited", "ops": ops, "seconds": secs, "ops_per_sec": float64(ops) / secs})
}

func pod(i, rv int) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{
		Namespace:       fmt.Sprintf("ns-%d", i%100),
		Name:            fmt.Sprintf("pod-%d", i),
		ResourceVersion: strconv.Itoa(rv),
	}}
}

func runFifo(n int) {
	type pair struct{ a, u *v1.Pod }
	pods := make([]pair, n)
	for i := range pods {
		pods[i] = pair{pod(i, 1), pod(i, 2)}
	}
	f := cache.NewDeltaFIFOWithOptions(cache.DeltaFIFOOptions{KeyFunction: cache.MetaNamespaceKeyFunc, EmitDeltaTypeReplaced: true})
	start := time.Now()
	for _, p := range pods {
		_ = f.Add(p.a)
		_ = f.Update(p.u)
	}
	for i := 0; i < n; i++ {
		_, _ = f.Pop(func(obj interface{}, _ bool) error { return nil })
	}
	addUpdatePop := time.Since(start).Seconds()
	list := make([]interface{}, n/10)
	for i := range list {
		list[i] = pod(i, 3)
	}
	start = time.Now()
	_ = f.Replace(list, "3")
	replace := time.Since(start).Seconds()
	emit(map[string]any{"scenario": "fifo", "n": n, "add_update_pop_seconds": addUpdatePop, "ops_per_sec": float64(3*n) / addUpdatePop, "replace_seconds": replace, "replace_objects": n / 10})
}

// runRealFifo is runFifo on a RealFIFO: the non-atomic one, with an empty
// store as known objects (what kinformer's RealFifo is), so every add and
// update is its own pop.
func runRealFifo(n int) {
	type pair struct{ a, u *v1.Pod }
	pods := make([]pair, n)
	for i := range pods {
		pods[i] = pair{pod(i, 1), pod(i, 2)}
	}
	known := cache.NewStore(cache.MetaNamespaceKeyFunc)
	f := cache.NewRealFIFOWithOptions(cache.RealFIFOOptions{KeyFunction: cache.MetaNamespaceKeyFunc, KnownObjects: known})
	start := time.Now()
	for _, p := range pods {
		_ = f.Add(p.a)
		_ = f.Update(p.u)
	}
	for i := 0; i < 2*n; i++ {
		_, _ = f.Pop(func(obj interface{}, _ bool) error { return nil })
	}
	addUpdatePop := time.Since(start).Seconds()
	list := make([]interface{}, n/10)
	for i := range list {
		list[i] = pod(i, 3)
	}
	start = time.Now()
	_ = f.Replace(list, "3")
	replace := time.Since(start).Seconds()
	emit(map[string]any{"scenario": "real-fifo", "n": n, "add_update_pop_seconds": addUpdatePop, "ops_per_sec": float64(4*n) / addUpdatePop, "replace_seconds": replace, "replace_objects": n / 10})
}

// restConfig reads the kubeconfig, with no client-side throttling, as for
// the Rust harnesses.
func restConfig(kubeconfig string) *rest.Config {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cfg.QPS = 10000
	cfg.Burst = 10000
	return cfg
}

func clientset(kubeconfig string) *kubernetes.Clientset {
	return kubernetes.NewForConfigOrDie(restConfig(kubeconfig))
}

func stripManagedFields(obj interface{}) (interface{}, error) {
	if p, ok := obj.(*v1.Pod); ok {
		p.ManagedFields = nil
	}
	return obj, nil
}

func hasArg(args []string, want string) bool {
	for _, a := range args {
		if a == want {
			return true
		}
	}
	return false
}

// runSync: the typed Pod informer, on protobuf (client-go's default for
// typed clients) or forced to JSON.
func runSync(kubeconfig, ns string, strip, json bool) {
	cfg := restConfig(kubeconfig)
	if json {
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return jsonOnly{rt} }
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	baseline := statusKB("VmRSS:")
	anonBaseline := statusKB("RssAnon:")
	opts := []informers.SharedInformerOption{informers.WithNamespace(ns)}
	if strip {
		opts = append(opts, informers.WithTransform(stripManagedFields))
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, opts...)
	inf := factory.Core().V1().Pods().Informer()
	v := measureSync(inf, factory.Start, baseline)
	addAnonPerObject(v, anonBaseline)
	v["scenario"] = "sync"
	v["strip_managed_fields"] = strip
	v["json"] = json
	emit(v)
}

// measureSync runs the informer (through start) with one no-op handler
// until it has synced, then, 2 s later, reads the RSS: time to synced, RSS
// and RSS growth per object since baseline.
func measureSync(inf cache.SharedIndexInformer, start func(<-chan struct{}), baseline uint64) map[string]any {
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{})
	stop := make(chan struct{})
	began := time.Now()
	u0, s0 := processCPUNs()
	start(stop)
	for !inf.HasSynced() {
		time.Sleep(5 * time.Millisecond)
	}
	syncSecs := time.Since(began).Seconds()
	u1, s1 := processCPUNs()
	cpuMs := float64(u1-u0+s1-s0) / 1e6
	time.Sleep(2 * time.Second)
	rss := statusKB("VmRSS:")
	hwm := statusKB("VmHWM:")
	anon := statusKB("RssAnon:")
	objects := len(inf.GetStore().ListKeys())
	close(stop)
	perObject := 0.0
	if objects > 0 && rss > baseline {
		perObject = float64((rss-baseline)*1024) / float64(objects)
	}
	return map[string]any{"pods": objects, "sync_seconds": syncSecs, "rss_bytes": rss * 1024, "peak_rss_bytes": hwm * 1024, "rss_anon_bytes": anon * 1024, "bytes_per_pod": perObject, "cpu_ms": cpuMs}
}

// addAnonPerObject adds the growth of anonymous RSS per object since
// anonBaseline (kB): the RSS growth without the program's own pages read
// in from its file during the sync.
func addAnonPerObject(v map[string]any, anonBaseline uint64) {
	anon, _ := v["rss_anon_bytes"].(uint64)
	objects, _ := v["pods"].(int)
	if objects > 0 && anon > anonBaseline*1024 {
		v["anon_bytes_per_pod"] = float64(anon-anonBaseline*1024) / float64(objects)
	}
}

// jsonOnly drops the protobuf alternatives from every Accept header, so the
// server answers in JSON: the metadata client asks for protobuf first and
// its ConfigFor cannot be told otherwise.
type jsonOnly struct{ next http.RoundTripper }

func (j jsonOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	var keep []string
	for _, t := range strings.Split(req.Header.Get("Accept"), ",") {
		if !strings.HasPrefix(strings.TrimSpace(t), "application/vnd.kubernetes.protobuf") {
			keep = append(keep, t)
		}
	}
	req = req.Clone(req.Context())
	req.Header.Set("Accept", strings.Join(keep, ","))
	return j.next.RoundTrip(req)
}

// runMetadataSync: client-go's metadatainformer over Pods (its defaults:
// protobuf on the wire; JSON when json is set), managedFields stripped by
// a transform.
func runMetadataSync(kubeconfig, ns string, json bool) {
	cfg := restConfig(kubeconfig)
	if json {
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return jsonOnly{rt} }
	}
	mc := metadata.NewForConfigOrDie(cfg)
	baseline := statusKB("VmRSS:")
	factory := metadatainformer.NewFilteredSharedInformerFactory(mc, 0, ns, nil)
	inf := factory.ForResource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Informer()
	_ = inf.SetTransform(func(obj interface{}) (interface{}, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			m.ManagedFields = nil
		}
		return obj, nil
	})
	v := measureSync(inf, factory.Start, baseline)
	v["scenario"] = "metadata-sync"
	v["json"] = json
	emit(v)
}

func runLatency(kubeconfig, ns string, seconds int) {
	cs := clientset(kubeconfig)
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns), informers.WithTransform(stripManagedFields))
	inf := factory.Core().V1().Pods().Informer()
	var mu sync.Mutex
	var samples []uint64
	var sents []uint64
	record := func(obj interface{}) {
		p, ok := obj.(*v1.Pod)
		if !ok {
			return
		}
		sent, err := strconv.ParseUint(p.Annotations["bench/sent-ns"], 10, 64)
		if err != nil {
			return
		}
		now := uint64(time.Now().UnixNano())
		if now < sent {
			now = sent
		}
		mu.Lock()
		samples = append(samples, now-sent)
		sents = append(sents, sent)
		mu.Unlock()
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, initial bool) {
			if !initial {
				record(obj)
			}
		},
		UpdateFunc: func(_, obj interface{}) { record(obj) },
	})
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	for !inf.HasSynced() {
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Fprintln(os.Stderr, "ready")
	time.Sleep(time.Duration(seconds) * time.Second)
	cancel()
	mu.Lock()
	v := samples
	sentAt := sents
	mu.Unlock()
	// Every update's latency, for cargo xtask bench to pair with another
	// client's that watched the same updates.
	if path := os.Getenv("BENCH_LATENCY_SAMPLES"); path != "" {
		var b strings.Builder
		for i := range v {
			fmt.Fprintf(&b, "%d %d\n", sentAt[i], v[i])
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	pct := func(q float64) float64 {
		if len(v) == 0 {
			return 0
		}
		i := int(float64(len(v)) * q)
		if i >= len(v) {
			i = len(v) - 1
		}
		return float64(v[i]) / 1e6
	}
	maxMs := 0.0
	if len(v) > 0 {
		maxMs = float64(v[len(v)-1]) / 1e6
	}
	emit(map[string]any{"scenario": "latency", "events": len(v), "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": maxMs})
}

// processCPUNs is the user and system CPU time of the whole process (the
// garbage collector's included), in nanoseconds.
func processCPUNs() (int64, int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return ru.Utime.Nano(), ru.Stime.Nano()
}

// runDecode decodes the Pod list in file (protobuf or JSON, as the server
// sent it; kinformer-bench fetch-pods writes it) rounds times offline, as
// an informer of client-go's typed clients does, clearing managedFields
// after decoding (client-go's transform) unless kept: the median CPU time
// per Pod of one decode.
func runDecode(file string, rounds int, strip bool) {
	body, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	format := "json"
	if bytes.HasPrefix(body, []byte("k8s\x00")) {
		format = "protobuf"
	}
	decoder := scheme.Codecs.UniversalDeserializer()
	perPod := make([]float64, 0, rounds)
	userPerPod := make([]float64, 0, rounds)
	pods := 0
	for r := 0; r < rounds || r == 0; r++ {
		user, system := processCPUNs()
		list := &v1.PodList{}
		if _, _, err := decoder.Decode(body, nil, list); err != nil {
			fmt.Fprintln(os.Stderr, "decoding:", err)
			os.Exit(1)
		}
		if strip {
			for i := range list.Items {
				list.Items[i].ManagedFields = nil
			}
		}
		pods = len(list.Items)
		userAfter, systemAfter := processCPUNs()
		perPod = append(perPod, float64(userAfter+systemAfter-user-system)/float64(max(pods, 1)))
		userPerPod = append(userPerPod, float64(userAfter-user)/float64(max(pods, 1)))
	}
	sort.Float64s(perPod)
	sort.Float64s(userPerPod)
	emit(map[string]any{"scenario": "decode", "format": format, "pods": pods,
		"bytes_per_pod":       float64(len(body)) / float64(max(pods, 1)),
		"cpu_us_per_pod":      perPod[len(perPod)/2] / 1e3,
		"user_cpu_us_per_pod": userPerPod[len(userPerPod)/2] / 1e3})
}
