package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/scheme"
)

// namespace is where every case is installed.
const namespace = "deskway"

// strictScheme knows the Kubernetes types and the Prometheus Operator's.
var strictScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := scheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := monitoringv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// object is one rendered object, decoded.
type object struct {
	file string
	kind string
	obj  runtime.Object
	raw  string
}

// rendered is one helm template run.
type rendered struct {
	objects []object
	notes   string
}

func (r *rendered) kinds() []string {
	var k []string
	for _, o := range r.objects {
		k = append(k, o.kind)
	}
	return k
}

// secrets returns the rendered Secrets' data by name.
func (r *rendered) secrets() map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, o := range r.objects {
		if s, ok := o.obj.(*corev1.Secret); ok {
			d := map[string]string{}
			for k, v := range s.Data {
				d[k] = string(v)
			}
			for k, v := range s.StringData {
				d[k] = v
			}
			out[s.Name] = d
		}
	}
	return out
}

// pods returns every workload's role and pod template.
func (r *rendered) pods() map[string]*corev1.PodTemplateSpec {
	out := map[string]*corev1.PodTemplateSpec{}
	for _, o := range r.objects {
		switch w := o.obj.(type) {
		case *appsv1.Deployment:
			out[w.Spec.Template.Labels["app.kubernetes.io/component"]] = &w.Spec.Template
		case *appsv1.StatefulSet:
			out[w.Spec.Template.Labels["app.kubernetes.io/component"]] = &w.Spec.Template
		}
	}
	return out
}

// configMap returns the data of the ConfigMap called name.
func (r *rendered) configMap(name string) map[string]string {
	for _, o := range r.objects {
		if c, ok := o.obj.(*corev1.ConfigMap); ok && c.Name == name {
			return c.Data
		}
	}
	return nil
}

// render is helm template (helm upgrade when upgrade is set) of the chart
// with vals, as release "desk", against a cluster whose Secrets lookup
// reads; every object is decoded strictly.
func render(ch *chart.Chart, vals map[string]any, cluster engine.ClientProvider, upgrade bool) (*rendered, error) {
	opts := chartutil.ReleaseOptions{Name: "desk", Namespace: namespace, Revision: 1, IsInstall: !upgrade, IsUpgrade: upgrade}
	if upgrade {
		opts.Revision = 2
	}
	rv, err := chartutil.ToRenderValues(ch, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engine.RenderWithClientProvider(ch, rv, cluster)
	if err != nil {
		return nil, err
	}
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, strictScheme, strictScheme,
		json.SerializerOptions{Yaml: true, Strict: true})
	r := &rendered{}
	for _, f := range sortedKeys(files) {
		if strings.HasSuffix(f, "NOTES.txt") {
			r.notes = files[f]
			continue
		}
		if !strings.HasSuffix(f, ".yaml") {
			continue
		}
		for _, doc := range strings.Split(files[f], "\n---") {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			obj, gvk, err := strict.Decode([]byte(doc), nil, nil)
			if err != nil {
				return nil, fmt.Errorf("%s: %w\n%s", f, err, doc)
			}
			r.objects = append(r.objects, object{file: f, kind: gvk.Kind, obj: obj, raw: doc})
		}
	}
	return r, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// cluster is a namespace holding Secrets, for the chart's lookup calls.
type cluster struct{ client dynamic.Interface }

// newCluster is a cluster with the given Secrets in the release's
// namespace.
func newCluster(secrets map[string]map[string]string) engine.ClientProvider {
	var objs []runtime.Object
	for name, data := range secrets {
		s := &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		objs = append(objs, s)
	}
	return cluster{client: dynamicfake.NewSimpleDynamicClient(scheme.Scheme, objs...)}
}

// GetClientFor implements engine.ClientProvider; the chart looks up
// Secrets only.
func (c cluster) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	if apiVersion != "v1" || kind != "Secret" {
		return nil, false, fmt.Errorf("the chart looked up %s %s; chartcheck's cluster has Secrets only", apiVersion, kind)
	}
	return c.client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}), true, nil
}

// writePodFiles writes, under dir/ROLE/ (dir/ROLE-N/ for pod N of a
// StatefulSet whose pods each mount a file of their own), every file each
// role's container mounts from a ConfigMap or Secret, at its mount path:
// the deskway.yaml and the secret files it names.
func writePodFiles(dir string, r *rendered, existing map[string]map[string]string) error {
	secrets := r.secrets()
	for name, data := range existing {
		if _, ok := secrets[name]; !ok {
			secrets[name] = data
		}
	}
	secretKey := func(name, key string) (string, error) {
		d, ok := secrets[name]
		if !ok {
			return "", fmt.Errorf("the pod mounts Secret %s, which the chart does not make and the case does not have", name)
		}
		v, ok := d[key]
		if !ok {
			return "", fmt.Errorf("the pod mounts key %s of Secret %s, which has no such key", key, name)
		}
		return v, nil
	}
	for _, in := range r.instances() {
		role, pod := in.role, in.pod
		volumes := map[string]map[string]string{} // volume, path inside it, content
		for _, v := range pod.Spec.Volumes {
			files := map[string]string{}
			switch {
			case v.ConfigMap != nil:
				cm := r.configMap(v.ConfigMap.Name)
				if cm == nil {
					return fmt.Errorf("%s mounts ConfigMap %s, which the chart does not make", role, v.ConfigMap.Name)
				}
				for k, body := range cm {
					files[k] = body
				}
			case v.Secret != nil:
				for _, it := range v.Secret.Items {
					val, err := secretKey(v.Secret.SecretName, it.Key)
					if err != nil {
						return fmt.Errorf("%s: %w", role, err)
					}
					files[it.Path] = val
				}
			case v.Projected != nil:
				for _, src := range v.Projected.Sources {
					if src.Secret == nil {
						continue
					}
					for _, it := range src.Secret.Items {
						val, err := secretKey(src.Secret.Name, it.Key)
						if err != nil {
							return fmt.Errorf("%s: %w", role, err)
						}
						files[it.Path] = val
					}
				}
			}
			volumes[v.Name] = files
		}
		c := pod.Spec.Containers[0]
		for _, m := range c.VolumeMounts {
			sub, err := subPath(c, m, in.name)
			if err != nil {
				return fmt.Errorf("%s: %w", in.dir, err)
			}
			if sub != "" {
				if _, ok := volumes[m.Name][sub]; !ok {
					return fmt.Errorf("%s mounts %s of volume %s, which has no such file", in.dir, sub, m.Name)
				}
			}
			for p, body := range volumes[m.Name] {
				target := path.Join(m.MountPath, p)
				if sub != "" {
					if p != sub {
						continue
					}
					target = m.MountPath
				}
				f := filepath.Join(dir, in.dir, filepath.FromSlash(target))
				if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// selfSigned makes a certificate and key in PEM for names, as an
// operator's existing TLS Secret would hold.
func selfSigned(names ...string) (crt, key string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", err
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})), nil
}
