package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
)

// productionProblems checks what a production install needs of every
// workload the chart renders: Pod Security "restricted" (Kubernetes' own
// admission checks), no service account token, a PodDisruptionBudget,
// topology spread, resources, startup, readiness and liveness probes, a
// metrics port behind a Service, a NetworkPolicy, a checksum of its
// config, the broker's SQLite on a claim, stream's headless Service,
// each broker of a StatefulSet naming the others in broker.peers, and
// no secret value in any object but a Secret. existing are the
// Secrets the cluster already has, by name, for what the pods mount.
func productionProblems(r *rendered, inline []string, existing map[string]map[string]string) []string {
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		return []string{err.Error()}
	}
	restricted := psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}
	var (
		accounts = map[string]*corev1.ServiceAccount{}
		pdbs     []*policyv1.PodDisruptionBudget
		netpols  []*networkingv1.NetworkPolicy
		services []*corev1.Service
		claims   = map[string]bool{}
		monitors int
	)
	for _, o := range r.objects {
		switch v := o.obj.(type) {
		case *corev1.ServiceAccount:
			accounts[v.Name] = v
		case *policyv1.PodDisruptionBudget:
			pdbs = append(pdbs, v)
		case *networkingv1.NetworkPolicy:
			netpols = append(netpols, v)
		case *corev1.Service:
			services = append(services, v)
		case *corev1.PersistentVolumeClaim:
			claims[v.Name] = true
		case *monitoringv1.ServiceMonitor:
			monitors++
			if len(v.Spec.Endpoints) == 0 || v.Spec.Endpoints[0].Port != "metrics" {
				bad("ServiceMonitor %s scrapes no metrics port", v.Name)
			}
		}
	}
	if len(r.pods()) == 0 {
		bad("renders no workload")
	}
	for role, pod := range r.pods() {
		res := policy.AggregateCheckResults(eval.EvaluatePod(restricted, &pod.ObjectMeta, &pod.Spec))
		if !res.Allowed {
			bad("%s: Pod Security restricted refuses the pod: %s", role, res.ForbiddenDetail())
		}
		for _, f := range unmountedSecretFiles(r, pod) {
			bad("%s: its deskway.yaml names %s, which the pod does not mount", role, f)
		}
		spec := pod.Spec
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			bad("%s: the pod mounts a service account token (automountServiceAccountToken is not false)", role)
		}
		if sa := accounts[spec.ServiceAccountName]; sa == nil || sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			bad("%s: service account %q is not rendered with automountServiceAccountToken: false", role, spec.ServiceAccountName)
		}
		if !anySelects(pdbs, pod.Labels, func(p *policyv1.PodDisruptionBudget) *metav1.LabelSelector { return p.Spec.Selector }) {
			bad("%s: no PodDisruptionBudget selects its pods", role)
		}
		if !anySelects(netpols, pod.Labels, func(p *networkingv1.NetworkPolicy) *metav1.LabelSelector { return &p.Spec.PodSelector }) {
			bad("%s: no NetworkPolicy selects its pods", role)
		}
		if len(spec.TopologySpreadConstraints) == 0 {
			bad("%s: no topologySpreadConstraints", role)
		}
		for _, tsc := range spec.TopologySpreadConstraints {
			if sel, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector); err != nil || !sel.Matches(labels.Set(pod.Labels)) {
				bad("%s: a topology spread constraint does not select the pods it spreads", role)
			}
		}
		if pod.Annotations["checksum/config"] == "" {
			bad("%s: no checksum/config annotation", role)
		}
		for _, c := range spec.Containers {
			if c.StartupProbe == nil || c.ReadinessProbe == nil || c.LivenessProbe == nil {
				bad("%s: container %s lacks a startup, readiness or liveness probe", role, c.Name)
			}
			req, lim := c.Resources.Requests, c.Resources.Limits
			if req.Cpu().IsZero() || req.Memory().IsZero() || lim.Memory().IsZero() {
				bad("%s: container %s has no CPU and memory requests and memory limit", role, c.Name)
			}
			if !hasPort(c.Ports, "metrics") {
				bad("%s: container %s has no port named metrics", role, c.Name)
			}
		}
		if !serviceExposes(services, pod.Labels, "metrics") {
			bad("%s: no Service exposes its metrics port", role)
		}
		var onPostgres bool
		var dbErr error
		if role == "broker" {
			if onPostgres, dbErr = brokerOnPostgres(r, pod, existing); dbErr != nil {
				bad("broker: %v", dbErr)
			}
		}
		for _, v := range spec.Volumes {
			if v.Name == "state" && role == "broker" && !onPostgres && dbErr == nil {
				if v.PersistentVolumeClaim == nil {
					bad("broker: its SQLite database is not on a PersistentVolumeClaim (state volume %+v)", v.VolumeSource)
				} else if !claims[v.PersistentVolumeClaim.ClaimName] {
					bad("broker: claim %s is not rendered", v.PersistentVolumeClaim.ClaimName)
				}
			}
		}
	}
	for _, o := range r.objects {
		if s, ok := o.obj.(*appsv1.StatefulSet); ok {
			if !headless(services, s.Spec.ServiceName) {
				bad("StatefulSet %s: its serviceName %q is no rendered headless Service", s.Name, s.Spec.ServiceName)
			}
		}
	}
	problems = append(problems, peerProblems(r)...)
	if strings.Contains(fmt.Sprint(r.kinds()), "ServiceMonitor") != (monitors > 0) {
		bad("ServiceMonitor decoded into the wrong type")
	}
	for _, o := range r.objects {
		if s, ok := o.obj.(*corev1.Secret); ok && s.Type == corev1.SecretTypeTLS {
			if p := certProblem(s.Data["tls.crt"], s.Data["tls.key"]); p != "" {
				bad("Secret %s: %s", s.Name, p)
			}
		}
	}
	// Secret values, given inline or made by the chart, live in Secrets.
	values := append([]string{}, inline...)
	for _, d := range r.secrets() {
		for k, v := range d {
			if !strings.HasSuffix(k, ".crt") {
				values = append(values, v)
			}
		}
	}
	for _, o := range r.objects {
		if _, ok := o.obj.(*corev1.Secret); ok {
			continue
		}
		for _, v := range values {
			if len(v) >= 8 && strings.Contains(o.raw, v) {
				bad("%s %s (%s) holds a secret value", o.kind, name(o), o.file)
				break
			}
		}
	}
	return problems
}

func name(o object) string {
	if m, ok := o.obj.(metav1.Object); ok {
		return m.GetName()
	}
	return "?"
}

func anySelects[T any](objs []T, podLabels map[string]string, sel func(T) *metav1.LabelSelector) bool {
	for _, o := range objs {
		s, err := metav1.LabelSelectorAsSelector(sel(o))
		if err == nil && !s.Empty() && s.Matches(labels.Set(podLabels)) {
			return true
		}
	}
	return false
}

func hasPort(ports []corev1.ContainerPort, name string) bool {
	for _, p := range ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

func serviceExposes(services []*corev1.Service, podLabels map[string]string, port string) bool {
	for _, s := range services {
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(podLabels)) {
			continue
		}
		for _, p := range s.Spec.Ports {
			if p.TargetPort.StrVal == port {
				return true
			}
		}
	}
	return false
}

func headless(services []*corev1.Service, name string) bool {
	for _, s := range services {
		if s.Name == name && s.Spec.ClusterIP == corev1.ClusterIPNone {
			return true
		}
	}
	return false
}

// brokerOnPostgres says whether the database the broker's rendered
// config names is PostgreSQL. A file: reference is read where the pod
// mounts it, from the Secret the chart renders or the cluster has
// (existing); where neither has it (a documented command line renders
// with no cluster), the chart's own rule stands: a Secret holds a
// PostgreSQL URL, never a SQLite path.
func brokerOnPostgres(r *rendered, pod *corev1.PodTemplateSpec, existing map[string]map[string]string) (bool, error) {
	var cfg struct {
		Broker struct {
			Database string `json:"database"`
		} `json:"broker"`
	}
	// Each pod's file, where they have their own, names one database.
	for _, body := range configFilesOf(r, pod) {
		if err := yaml.Unmarshal([]byte(body), &cfg); err != nil {
			return false, fmt.Errorf("its deskway.yaml: %w", err)
		}
	}
	const secretsDir = "/etc/deskway/secrets/"
	db := cfg.Broker.Database
	if !strings.HasPrefix(db, "file:") {
		return isPostgres(db), nil
	}
	file, ok := strings.CutPrefix(strings.TrimPrefix(db, "file:"), secretsDir)
	if !ok {
		return false, fmt.Errorf("broker.database %s is not under %s, where the pod mounts its Secrets", db, secretsDir)
	}
	secrets := r.secrets()
	for name, data := range existing {
		if _, ok := secrets[name]; !ok {
			secrets[name] = data
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name != "secrets" || v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.Secret == nil {
				continue
			}
			for _, it := range src.Secret.Items {
				if it.Path != file {
					continue
				}
				data, ok := secrets[src.Secret.Name]
				if !ok {
					return true, nil
				}
				if !isPostgres(data[it.Key]) {
					return false, fmt.Errorf("broker.database is key %s of Secret %s, which holds no postgres:// URL", it.Key, src.Secret.Name)
				}
				return true, nil
			}
		}
	}
	// Not mounted: unmountedSecretFiles reports that, once.
	return true, nil
}

// secretRef is a secret file reference in a role's deskway.yaml.
var secretRef = regexp.MustCompile(`file:(/etc/deskway/secrets/[A-Za-z0-9._-]+)`)

// unmountedSecretFiles are the secret files the pod's deskway.yaml names
// that no Secret of its secrets volume is mounted as.
func unmountedSecretFiles(r *rendered, pod *corev1.PodTemplateSpec) []string {
	mounted := map[string]bool{}
	config := configFiles(r, pod)
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.Projected != nil && v.Name == "secrets":
			for _, src := range v.Projected.Sources {
				if src.Secret != nil {
					for _, it := range src.Secret.Items {
						mounted["/etc/deskway/secrets/"+it.Path] = true
					}
				}
			}
		}
	}
	var missing []string
	for _, m := range secretRef.FindAllStringSubmatch(config, -1) {
		if !mounted[m[1]] {
			missing = append(missing, m[1])
		}
	}
	return missing
}

func isPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// certProblem checks the certificate the chart makes as the roles use
// it: a key pair Go's TLS takes, which verifies, as its own root (the
// portal's web.broker_ca), for the broker's Service and the gateway's
// public name.
func certProblem(crt, key []byte) string {
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		return fmt.Sprintf("not a key pair: %v", err)
	}
	block, _ := pem.Decode(crt)
	if block == nil {
		return "tls.crt holds no PEM block"
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return err.Error()
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	for _, name := range []string{"desk-deskway-broker", "desk-deskway-broker.deskway.svc", "gateway.example.com"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			return fmt.Sprintf("does not verify for %s against itself: %v", name, err)
		}
	}
	return ""
}
