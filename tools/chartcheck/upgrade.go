package main

import (
	"fmt"
	"maps"
	"sort"

	"helm.sh/helm/v3/pkg/chart"
	corev1 "k8s.io/api/core/v1"
)

// upgradeProblems installs the case into a cluster that has its existing
// Secrets, then upgrades it with the same values: every Secret the chart
// made must keep its data (tokens handed out, the certificate, sign-in
// cookies stay valid), and each role's checksum/config must stay the
// same. Then, for each Secret a role's pods read, a change to it in the
// cluster must change that role's checksum, so the pods restart on it.
func upgradeProblems(ch *chart.Chart, c checkCase) []string {
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	install, err := render(ch, c.values, newCluster(c.existing), false)
	if err != nil {
		return []string{fmt.Sprintf("install: %v", err)}
	}
	made := install.secrets()
	live := copySecrets(c.existing)
	maps.Copy(live, copySecrets(made))
	up, err := render(ch, c.values, newCluster(live), true)
	if err != nil {
		return []string{fmt.Sprintf("upgrade: %v", err)}
	}
	kept := up.secrets()
	for _, name := range sortedKeys(made) {
		for _, k := range sortedKeys(made[name]) {
			if kept[name][k] != made[name][k] {
				bad("upgrade: Secret %s key %s changed (made on install, must be kept)", name, k)
			}
		}
	}
	before := checksums(up)
	again, err := render(ch, c.values, newCluster(live), true)
	if err != nil {
		return []string{fmt.Sprintf("upgrade: %v", err)}
	}
	for role, sum := range checksums(again) {
		if sum != before[role] {
			bad("%s: checksum/config differs between two upgrades with nothing changed", role)
		}
	}
	for role, pod := range up.pods() {
		for _, name := range readSecrets(pod) {
			changed := copySecrets(live)
			if changed[name] == nil {
				bad("%s reads Secret %s, which the cluster does not have after install", role, name)
				continue
			}
			for k := range changed[name] {
				changed[name][k] += "-rotated"
			}
			r, err := render(ch, c.values, newCluster(changed), true)
			if err != nil {
				bad("upgrade after rotating %s: %v", name, err)
				continue
			}
			if checksums(r)[role] == before[role] {
				bad("%s: checksum/config does not change when Secret %s, which its pods read, changes", role, name)
			}
		}
	}
	return problems
}

// checksums returns each role's checksum/config annotation.
func checksums(r *rendered) map[string]string {
	out := map[string]string{}
	for role, pod := range r.pods() {
		out[role] = pod.Annotations["checksum/config"]
	}
	return out
}

// readSecrets returns the Secrets a pod reads: volumes, projected
// sources and environment variables.
func readSecrets(pod *corev1.PodTemplateSpec) []string {
	seen := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil {
			seen[v.Secret.SecretName] = true
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.Secret != nil {
					seen[s.Secret.Name] = true
				}
			}
		}
	}
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				seen[e.ValueFrom.SecretKeyRef.Name] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func copySecrets(in map[string]map[string]string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for n, d := range in {
		out[n] = maps.Clone(d)
	}
	return out
}
