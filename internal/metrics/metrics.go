// Package metrics holds the Prometheus metrics of crustd and crust-csi-proxy and their HTTP endpoints:
// /metrics, /healthz (the process is alive) and /readyz (state loaded and the API socket serving) on
// --http-addr; and, on --metrics-secure-addr, /metrics alone over TLS for callers the API server
// authenticates and allows (Secure, package guard).
//
// Metric names are a contract for dashboards and alerts; docs/operators.md lists them. Served gRPC
// calls are counted under the names and labels every gRPC service uses (go-grpc-middleware's:
// grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}, grpc_server_handling_seconds
// and the rest), so that existing gRPC dashboards and alerts apply.
package metrics

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	certutil "k8s.io/client-go/util/cert"

	"crust.dev/crust/api/version"
	"crust.dev/crust/internal/metrics/guard"
)

// Metrics is one registry with crust's collectors. Create it with New.
type Metrics struct {
	Registry *prometheus.Registry
	grpc     *grpcprom.ServerMetrics
	gone     *prometheus.CounterVec
	ready    atomic.Bool
	gc       prometheus.Counter
	decided  *prometheus.CounterVec
	failed   *prometheus.CounterVec
	hostStat *prometheus.CounterVec
	// quarantined and unconsumed are crust-csi-proxy's: deferred volumes whose target held data at
	// unpublish, and those no sandbox claims while their pod runs.
	quarantined prometheus.Counter
	unconsumed  prometheus.Gauge
	// qBytes, qLimit and qPruned are the quarantine's size, its bound and the entries removed to keep it.
	qBytes, qLimit prometheus.Gauge
	qPruned        prometheus.Counter
}

// New returns a registry with the RPC metrics, crust_build_info and the Go and process collectors.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		grpc: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
			grpcprom.WithHistogramBuckets(prometheus.ExponentialBuckets(0.0001, 4, 10)))), // 100 µs to 26 s
		gone: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "crust_handler_claims_released_total",
			Help: "Claims crustd ended because their runtime handler was gone, by why: process_exited, endpoint_refused or sandbox_gone (a Kata sandbox found through CRI stopped).",
		}, []string{"why"}),
	}
	m.gc = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "crust_garbage_collected_volumes_total",
		Help: "Descriptors unstaged because the kubelet directory of their pod was gone.",
	})
	m.decided = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "crust_csi_proxy_publish_decisions_total",
		Help: "NodePublishVolume calls of volumes that ask for deferral, as crust-csi-proxy decided them, by decision (pass-through, defer, host-mount) and volume_mode (filesystem, block).",
	}, []string{"decision", "volume_mode"})
	m.failed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "crust_csi_proxy_publish_failures_total",
		Help: "NodePublishVolume calls crust-csi-proxy deferred or mounted on the host that failed, by mode (deferred, host); each is also a VolumeDeferralFailed event on the pod, or a VolumeHeldByAnotherPod event when another pod holds the volume.",
	}, []string{"mode"})
	m.hostStat = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "crust_stats_from_host_total",
		Help: "Volume stats crustd answered from the host, because no sandbox had claimed the volume yet (the total only), by volume_mode (filesystem, block).",
	}, []string{"volume_mode"})
	m.quarantined = prometheus.NewCounter(prometheus.CounterOpts{Name: "crust_csi_proxy_quarantined_targets_total",
		Help: "Deferred volumes' target directories crust-csi-proxy moved into <kubelet>/crust-quarantine at NodeUnpublishVolume because they held data: a runtime wrote to the node's disk instead of the volume; each is also a VolumeDataQuarantined event on the pod."})
	m.unconsumed = prometheus.NewGauge(prometheus.GaugeOpts{Name: "crust_csi_proxy_unconsumed_volumes",
		Help: "Deferred volumes that no sandbox has claimed although their pod is Running (past --unconsumed-grace), as crust-csi-proxy last checked; each is also a VolumeNotConsumed event on the pod."})
	m.qBytes = prometheus.NewGauge(prometheus.GaugeOpts{Name: "crust_csi_proxy_quarantine_bytes",
		Help: "Bytes of the files in <kubelet>/crust-quarantine, as crust-csi-proxy last measured them."})
	m.qLimit = prometheus.NewGauge(prometheus.GaugeOpts{Name: "crust_csi_proxy_quarantine_limit_bytes",
		Help: "crust-csi-proxy's --quarantine-max-bytes: past it, the oldest quarantined targets are deleted."})
	m.qPruned = prometheus.NewCounter(prometheus.CounterOpts{Name: "crust_csi_proxy_quarantine_pruned_total",
		Help: "Quarantined targets crust-csi-proxy deleted to keep the quarantine within --quarantine-max-age and --quarantine-max-bytes."})
	bi := version.Get()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "crust_build_info",
		Help:        "Always 1; its labels say which build of crust serves: version, revision (VCS) and goversion.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "goversion": bi.GoVersion},
	})
	build.Set(1)
	m.Registry.MustRegister(m.grpc, m.gone, m.gc, m.decided, m.failed, m.hostStat, m.quarantined, m.unconsumed, m.qBytes, m.qLimit, m.qPruned, build, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// UnaryServerInterceptor counts the unary calls of a server; it goes first in the chain, so that it sees
// the code the client is sent.
func (m *Metrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return m.grpc.UnaryServerInterceptor()
}

// StreamServerInterceptor counts the streaming calls of a server (and those the proxy forwards raw); it
// goes first in the chain.
func (m *Metrics) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return m.grpc.StreamServerInterceptor()
}

// HandlerGone counts one claim ended because its handler was gone.
func (m *Metrics) HandlerGone(why string) { m.gone.WithLabelValues(why).Inc() }

// PublishDecision counts one publish of a volume that asks for deferral, as crust-csi-proxy decided it
// (crustd counts none).
func (m *Metrics) PublishDecision(decision, volumeMode string) {
	m.decided.WithLabelValues(decision, volumeMode).Inc()
}

// PublishFailed counts one publish the proxy deferred (mode "deferred") or mounted on the host ("host")
// that failed.
func (m *Metrics) PublishFailed(mode string) { m.failed.WithLabelValues(mode).Inc() }

// TargetQuarantined counts one deferred volume's target that crust-csi-proxy moved into the quarantine.
func (m *Metrics) TargetQuarantined() { m.quarantined.Inc() }

// SetQuarantine sets the quarantine's size and its bound, in bytes, and counts pruned entries deleted to
// keep it.
func (m *Metrics) SetQuarantine(bytes, limit int64, pruned int) {
	m.qBytes.Set(float64(bytes))
	m.qLimit.Set(float64(limit))
	m.qPruned.Add(float64(pruned))
}

// SetUnconsumedVolumes sets the number of deferred volumes no sandbox claims while their pod runs.
func (m *Metrics) SetUnconsumedVolumes(n int) { m.unconsumed.Set(float64(n)) }

// StatsFromHost counts one stats answer crustd gave from the host for a volume of volumeMode
// ("filesystem" or "block") that no sandbox claims.
func (m *Metrics) StatsFromHost(volumeMode string) { m.hostStat.WithLabelValues(volumeMode).Inc() }

// CollectedGarbage counts n descriptors of deleted pods unstaged by the collector.
func (m *Metrics) CollectedGarbage(n int) { m.gc.Add(float64(n)) }

// VolumeGauges registers crust_volumes{state="staged"|"claimed"}, read from counts at scrape time: held
// is every descriptor, claimed those a sandbox claims. A descriptor is in one state only, staged (no
// sandbox claims it) or claimed, so sum(crust_volumes) is the number held.
func (m *Metrics) VolumeGauges(counts func() (held, claimed int)) {
	for _, st := range []string{"staged", "claimed"} {
		m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "crust_volumes",
			Help:        "Descriptors held, by state: staged (no sandbox claims it) or claimed; each is counted once.",
			ConstLabels: prometheus.Labels{"state": st},
		}, func() float64 {
			h, c := counts()
			if st == "claimed" {
				return float64(c)
			}
			return float64(h - c)
		}))
	}
}

// QuarantineGauge registers crust_quarantined_entries{reason}: how many entries crustd set aside instead
// of failing for (a Kata projection it could not write, a non-UTF-8 file in a Kata volume directory, a
// damaged store record), by reason, read from counts at scrape time. Every reason counts returns is
// reported, zeros included, so that an alert can compare with 0.
func (m *Metrics) QuarantineGauge(counts func() map[string]int) {
	m.Registry.MustRegister(&quarantine{counts: counts, desc: prometheus.NewDesc("crust_quarantined_entries",
		"Entries crustd set aside and reports through crustctl doctor, by reason.", []string{"reason"}, nil)})
}

type quarantine struct {
	counts func() map[string]int
	desc   *prometheus.Desc
}

func (q *quarantine) Describe(ch chan<- *prometheus.Desc) { ch <- q.desc }

func (q *quarantine) Collect(ch chan<- prometheus.Metric) {
	for reason, n := range q.counts() {
		ch <- prometheus.MustNewConstMetric(q.desc, prometheus.GaugeValue, float64(n), reason)
	}
}

// SetReady flips /readyz.
func (m *Metrics) SetReady(ready bool) { m.ready.Store(ready) }

// Handler serves /metrics, /healthz and /readyz.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !m.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// Serve serves Handler on addr (--http-addr), and /metrics as secure says, until stop is called; a
// serving error after the start goes to errc, one at most from each. An empty address serves nothing
// there.
func (m *Metrics) Serve(addr string, secure Secure, log *slog.Logger, errc chan<- error) (stop func(), err error) {
	stopSecure, err := m.serveSecure(secure, log, errc)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		return stopSecure, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		stopSecure()
		return nil, fmt.Errorf("listen on --http-addr %s: %w", addr, err)
	}
	stopHTTP := serve(l, &http.Server{Handler: m.Handler(), ReadHeaderTimeout: 5 * time.Second}, errc)
	return func() { stopHTTP(); stopSecure() }, nil
}

// Secure is the authenticated endpoint: /metrics alone, over TLS, each request let through by a guard
// (internal/metrics/guard) that asks the API server who is asking and whether they may.
type Secure struct {
	Addr              string // "" serves nothing
	CertFile, KeyFile string // the server's certificate and key; "": a self-signed pair made at start
	// API is where the guard asks; nil: the API server of the pod's service account.
	API *guard.APIServer
}

// AddFlags registers --metrics-secure-addr, --metrics-tls-cert-file and --metrics-tls-key-file.
func (s *Secure) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.Addr, "metrics-secure-addr", "", "address for /metrics over TLS, for bearer tokens the API server accepts and allows "+
		"`get` on the non-resource URL /metrics (such as $(NODE_IP):9443; \"\" disables; needs a service account that may create "+
		"TokenReviews and SubjectAccessReviews)")
	fs.StringVar(&s.CertFile, "metrics-tls-cert-file", "", "certificate of --metrics-secure-addr (default: a self-signed one made at start)")
	fs.StringVar(&s.KeyFile, "metrics-tls-key-file", "", "key of --metrics-tls-cert-file")
}

// serveSecure serves /metrics as s says until stop is called.
func (m *Metrics) serveSecure(s Secure, log *slog.Logger, errc chan<- error) (stop func(), err error) {
	if s.Addr == "" {
		return func() {}, nil
	}
	srv, err := m.secureServer(s, log)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on --metrics-secure-addr %s: %w", s.Addr, err)
	}
	return serve(tls.NewListener(l, srv.TLSConfig), srv, errc), nil
}

// secureServer is the server of s: its handler serves /metrics behind the guard, and its TLSConfig holds
// the certificate.
func (m *Metrics) secureServer(s Secure, log *slog.Logger) (*http.Server, error) {
	host, _, err := net.SplitHostPort(s.Addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-secure-addr %s: %w", s.Addr, err)
	}
	var pair tls.Certificate
	if s.CertFile != "" || s.KeyFile != "" {
		pair, err = tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
	} else {
		var crt, key []byte
		if crt, key, err = certutil.GenerateSelfSignedCertKey(cmp.Or(host, "localhost"), nil, nil); err == nil {
			pair, err = tls.X509KeyPair(crt, key)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("--metrics-secure-addr's certificate: %w", err)
	}
	api := s.API
	if api == nil {
		in, err := guard.InCluster()
		if err != nil {
			return nil, fmt.Errorf("--metrics-secure-addr: %w", err)
		}
		api = &in
	}
	g, err := guard.New(*api, log)
	if err != nil {
		return nil, fmt.Errorf("--metrics-secure-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", g.Wrap(promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})))
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		// Failed handshakes (scanners, plain HTTP) are noise at info.
		ErrorLog:  slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}}, nil
}

// serve runs srv on l until the returned stop is called.
func serve(l net.Listener, srv *http.Server, errc chan<- error) (stop func()) {
	go func() {
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("http: %w", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}
