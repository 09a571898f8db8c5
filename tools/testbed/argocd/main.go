// Command argocd-health runs a resource health check in Argo CD's own runtime: the Lua VM of
// github.com/argoproj/argo-cd/v3/util/lua (gopher-lua with Argo CD's sandbox: only the base, table and
// package libraries and a "safe" os are open unless useOpenLibs is set, a one-second deadline, Argo CD's
// conversion of the object into Lua and of the returned table into a health status), called the way the
// application controller calls it: gitops-engine's health.GetResourceHealth with Argo CD's resource
// overrides.
//
// Usage:
//
//	argocd-health -script FILE [-use-open-libs] [RESOURCE.json]
//	argocd-health -argocd-cm CONFIGMAP.yaml [RESOURCE.json]
//	argocd-health -version   (the Argo CD, gitops-engine, gopher-lua and Go versions linked in, as JSON)
//
// -script is the health script as argocd-cm holds it under resource.customizations.health.<group>_<kind>,
// used as the override of the resource's own group/kind. -argocd-cm is a whole argocd-cm ConfigMap (YAML
// or JSON): Argo CD's settings manager reads the overrides from it, as `argocd admin settings
// resource-overrides health --argocd-cm-path` does (through client-go's in-memory clientset, Argo CD's own
// offline path), so a key Argo CD would not match against the resource's group/kind finds no script.
// The resource (stdin without a path) is decoded as client-go decodes what the API server sends
// (unstructured JSON: integral numbers become int64, others float64).
//
// Prints {"status": ..., "message": ...} and exits 0; or, when the script fails (Argo CD shows the health
// as Unknown with the error), {"status": "Unknown", "message": ..., "error": ...} and exits 1; no health
// script for the resource exits 1 too. Usage and input errors exit 2.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/argoproj/argo-cd/gitops-engine/v3/pkg/health"
	log "github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/lua"
	"github.com/argoproj/argo-cd/v3/util/settings"
)

type result struct {
	Status  string `json:"status"`
	Message string `json:"message"`
	Error   string `json:"error,omitempty"`
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "argocd-health: "+format+"\n", args...)
	os.Exit(code)
}

// overridesFromConfigMap is what `argocd admin settings resource-overrides health --argocd-cm-path` does
// (cmd/argocd/commands/admin/settings.go, createSettingsManager): the ConfigMap and a minimal argocd-secret
// in client-go's in-memory clientset, Argo CD's settings manager over it, its resource overrides.
func overridesFromConfigMap(path string) (map[string]v1alpha1.ResourceOverride, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cm corev1.ConfigMap
	if err := yaml.Unmarshal(data, &cm); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if cm.Name != common.ArgoCDConfigMapName {
		return nil, fmt.Errorf("%s: the ConfigMap is %q, Argo CD reads %q", path, cm.Name, common.ArgoCDConfigMapName)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: common.ArgoCDSecretName},
		Data:       map[string][]byte{"admin.password": []byte("test"), "server.secretkey": []byte("test")},
	}
	for _, o := range []metav1.Object{&cm, secret} {
		o.SetNamespace("default")
		labels := o.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels["app.kubernetes.io/part-of"] = "argocd"
		o.SetLabels(labels)
	}
	manager := settings.NewSettingsManager(context.Background(), fake.NewClientset(secret, &cm), "default")
	if err := manager.ResyncInformers(); err != nil {
		return nil, err
	}
	return manager.GetResourceOverrides()
}

// versions are the module versions this binary was linked with (the go.mod pins, as the linker saw them).
func versions() map[string]string {
	v := map[string]string{}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		fail(2, "no build information in the binary")
	}
	v["go"] = info.GoVersion
	names := map[string]string{
		"github.com/argoproj/argo-cd/v3":               "argo-cd",
		"github.com/argoproj/argo-cd/gitops-engine/v3": "gitops-engine",
		"github.com/yuin/gopher-lua":                   "gopher-lua",
	}
	for _, dep := range info.Deps {
		if name, ok := names[dep.Path]; ok {
			if dep.Replace != nil {
				dep = dep.Replace
			}
			v[name] = dep.Version
		}
	}
	return v
}

func main() {
	scriptPath := flag.String("script", "", "the Lua health script, as the override of the resource's group/kind")
	useOpenLibs := flag.Bool("use-open-libs", false, "with -script: as resource.customizations.useOpenLibs.<group>_<kind>: true (Argo CD's default is false)")
	cmPath := flag.String("argocd-cm", "", "an argocd-cm ConfigMap (YAML or JSON) to read the resource overrides from")
	version := flag.Bool("version", false, "print the versions linked in, as JSON")
	flag.Parse()
	if *version {
		_ = json.NewEncoder(os.Stdout).Encode(versions())
		return
	}
	if (*scriptPath == "") == (*cmPath == "") || flag.NArg() > 1 || (*useOpenLibs && *scriptPath == "") {
		fail(2, "usage: argocd-health {-script FILE [-use-open-libs] | -argocd-cm CONFIGMAP.yaml} [RESOURCE.json]")
	}
	log.SetLevel(log.WarnLevel) // the settings manager's informational lines
	var data []byte
	var err error
	if flag.NArg() == 1 && flag.Arg(0) != "-" {
		data, err = os.ReadFile(flag.Arg(0))
	} else {
		data, err = io.ReadAll(os.Stdin)
	}
	if err != nil {
		fail(2, "%v", err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(data); err != nil {
		fail(2, "the resource: %v", err)
	}
	// Argo CD keys resource overrides by "<group>/<kind>" (argocd-cm's "<group>_<kind>" suffix).
	key := lua.GetConfigMapKey(obj.GroupVersionKind())

	var overrides map[string]v1alpha1.ResourceOverride
	if *scriptPath != "" {
		script, err := os.ReadFile(*scriptPath)
		if err != nil {
			fail(2, "%v", err)
		}
		overrides = map[string]v1alpha1.ResourceOverride{key: {HealthLua: string(script), UseOpenLibs: *useOpenLibs}}
	} else if overrides, err = overridesFromConfigMap(*cmPath); err != nil {
		fail(2, "%v", err)
	}

	hs, err := health.GetResourceHealth(obj, lua.ResourceHealthOverrides(overrides))
	out := json.NewEncoder(os.Stdout)
	out.SetEscapeHTML(false)
	switch {
	case err != nil:
		r := result{Error: err.Error()}
		if hs != nil {
			r.Status, r.Message = string(hs.Status), hs.Message
		}
		_ = out.Encode(r)
		os.Exit(1)
	case hs == nil:
		fail(1, "no health check for %s: Argo CD has no health script for it", key)
	}
	if err := out.Encode(result{Status: string(hs.Status), Message: hs.Message}); err != nil {
		fail(2, "%v", err)
	}
}
