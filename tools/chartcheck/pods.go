package main

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// instance is a pod as the files it mounts tell it from the others: all
// the pods of a workload, which see the same files, or one pod of a
// StatefulSet whose pods each mount a file of their own (a subPathExpr
// naming the pod).
type instance struct {
	role string
	// dir is where its files are written: ROLE, or ROLE-N for pod N.
	dir string
	pod *corev1.PodTemplateSpec
	// name is the pod's own name, "" where the pods are alike.
	name string
}

// instances returns every distinct pod the chart runs.
func (r *rendered) instances() []instance {
	var out []instance
	for _, o := range r.objects {
		switch w := o.obj.(type) {
		case *appsv1.Deployment:
			role := w.Spec.Template.Labels["app.kubernetes.io/component"]
			out = append(out, instance{role: role, dir: role, pod: &w.Spec.Template})
		case *appsv1.StatefulSet:
			role := w.Spec.Template.Labels["app.kubernetes.io/component"]
			if !perPod(&w.Spec.Template) {
				out = append(out, instance{role: role, dir: role, pod: &w.Spec.Template})
				continue
			}
			n := 1
			if w.Spec.Replicas != nil {
				n = int(*w.Spec.Replicas)
			}
			for i := range n {
				out = append(out, instance{role: role, dir: fmt.Sprintf("%s-%d", role, i), pod: &w.Spec.Template, name: fmt.Sprintf("%s-%d", w.Name, i)})
			}
		}
	}
	return out
}

// perPod says whether a pod mounts a file named after itself.
func perPod(pod *corev1.PodTemplateSpec) bool {
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.SubPathExpr != "" {
				return true
			}
		}
	}
	return false
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// subPath is the file a mount takes from its volume in pod name, as the
// kubelet expands a subPathExpr: each $(VAR) from the container's
// environment, where chartcheck knows only the pod's name
// (fieldRef metadata.name).
func subPath(c corev1.Container, m corev1.VolumeMount, name string) (string, error) {
	if m.SubPathExpr == "" {
		return m.SubPath, nil
	}
	var err error
	out := envRef.ReplaceAllStringFunc(m.SubPathExpr, func(ref string) string {
		v := envRef.FindStringSubmatch(ref)[1]
		for _, e := range c.Env {
			if e.Name == v && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" && name != "" {
				return name
			}
		}
		err = fmt.Errorf("mount %s: subPathExpr %s names $(%s), which is not the pod's name in its environment", m.Name, m.SubPathExpr, v)
		return ref
	})
	return out, err
}

// configFiles is every file of the ConfigMap a pod's config volume is,
// joined: the deskway.yaml of each pod it serves.
func configFiles(r *rendered, pod *corev1.PodTemplateSpec) string {
	var b strings.Builder
	cm := configFilesOf(r, pod)
	for _, k := range sortedKeys(cm) {
		b.WriteString(cm[k] + "\n")
	}
	return b.String()
}

// peerProblems checks the brokers' peer lists where they run as a
// StatefulSet: each pod's file of the ConfigMap names, in broker.peers,
// every other pod and not itself, by the names the StatefulSet's
// governing Service gives them (<pod>.<service>) and the port that
// Service has for the broker's, which is what they resolve to in a
// cluster.
func peerProblems(r *rendered) []string {
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	services := map[string]*corev1.Service{}
	for _, o := range r.objects {
		if s, ok := o.obj.(*corev1.Service); ok {
			services[s.Name] = s
		}
	}
	for _, o := range r.objects {
		sts, ok := o.obj.(*appsv1.StatefulSet)
		if !ok || sts.Spec.Template.Labels["app.kubernetes.io/component"] != "broker" {
			continue
		}
		svc := services[sts.Spec.ServiceName]
		if svc == nil {
			bad("StatefulSet %s: no Service %s names its pods", sts.Name, sts.Spec.ServiceName)
			continue
		}
		var port int32
		for _, p := range svc.Spec.Ports {
			if p.TargetPort.StrVal == "broker" {
				port = p.Port
			}
		}
		if port == 0 {
			bad("Service %s has no port for the broker's", svc.Name)
			continue
		}
		n := int(*sts.Spec.Replicas)
		files := configFilesOf(r, &sts.Spec.Template)
		for i := range n {
			pod := fmt.Sprintf("%s-%d", sts.Name, i)
			body, ok := files[pod+".yaml"]
			if !ok {
				bad("broker pod %s has no file %s.yaml in its ConfigMap", pod, pod)
				continue
			}
			var cfg struct {
				Broker struct {
					Peers []string `json:"peers"`
				} `json:"broker"`
			}
			if err := yaml.Unmarshal([]byte(body), &cfg); err != nil {
				bad("broker pod %s: its deskway.yaml: %v", pod, err)
				continue
			}
			var want []string
			for j := range n {
				if j != i {
					want = append(want, (&url.URL{Scheme: "https", Host: fmt.Sprintf("%s-%d.%s:%d", sts.Name, j, svc.Name, port)}).String())
				}
			}
			if !slices.Equal(cfg.Broker.Peers, want) {
				bad("broker pod %s: broker.peers %v, want the other pods by their names in Service %s, %v", pod, cfg.Broker.Peers, svc.Name, want)
			}
		}
	}
	return problems
}

// configFilesOf is the ConfigMap a pod's config volume is.
func configFilesOf(r *rendered, pod *corev1.PodTemplateSpec) map[string]string {
	for _, v := range pod.Spec.Volumes {
		if v.ConfigMap != nil && v.Name == "config" {
			return r.configMap(v.ConfigMap.Name)
		}
	}
	return nil
}
