package sandbox

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
)

// What a call that meets a suspended Sandbox advises (review of December 6, as the Python SDK's fix
// 03fabe5): resume on request takes both the Sandbox's opt-in (lifecycle.agents.x-k8s.io/auto-resume:
// "true", on it or on its SandboxTemplate) and a router running --sandbox-lifecycle. The advice used to be
// "or run the router with --sandbox-lifecycle to resume it on request" always, also through a router that
// runs it, where the missing piece was the annotation.

const testAutoResume = "lifecycle.agents.x-k8s.io/auto-resume"

var testTemplatesGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxtemplates"}

func TestTheSuspendedAdviceNamesTheAutoResumeOptIn(t *testing.T) {
	optIn := `for resume on request, annotate the Sandbox or its SandboxTemplate ns/tpl with ` + testAutoResume +
		`: "true" (served by a router running --sandbox-lifecycle)`
	for _, tc := range []struct {
		name      string
		own       map[string]string // the Sandbox's annotations (besides its template ref)
		noRef     bool              // the Sandbox names no template
		template  map[string]string // the template's annotations; nil: no template
		forbidden bool              // reading templates is forbidden
		want      string
	}{
		{"no opt-in", nil, false, map[string]string{}, false, optIn},
		{"no template", nil, false, nil, false, optIn},
		{"the template is not readable", nil, false, map[string]string{testAutoResume: "true"}, true, optIn},
		{"no template ref", nil, true, nil, false, `for resume on request, annotate the Sandbox or its SandboxTemplate with ` +
			testAutoResume + `: "true" (served by a router running --sandbox-lifecycle)`},
		{"asks on the Sandbox", map[string]string{testAutoResume: "true"}, false, map[string]string{}, false,
			`it asks to be resumed on request (` + testAutoResume + `: "true" on the Sandbox), but this request did ` +
				`not go through a router running --sandbox-lifecycle, or it reached the Sandbox's pod as it was ` +
				`suspended and that router could not send it again (it may have run there): calling again then ` +
				`resumes the Sandbox`},
		{"asks on the template", nil, false, map[string]string{testAutoResume: "True"}, false,
			`it asks to be resumed on request (` + testAutoResume + `: "True" on its SandboxTemplate ns/tpl), but ` +
				`this request did not go through a router running --sandbox-lifecycle`},
		// the router takes "true" or "false" in any case, nothing else: off, and said so
		{"not a valid value", nil, false, map[string]string{testAutoResume: "true "}, false,
			`resume on request is off: ` + testAutoResume + `: "true " on its SandboxTemplate ns/tpl is not a valid ` +
				`value (want "true" or "false"; the router reads any other value as "false"): set it to "true" for ` +
				`resume on request, served by a router running --sandbox-lifecycle`},
		// the Sandbox's own value wins over its template's
		{"off on the Sandbox", map[string]string{testAutoResume: "false"}, false, map[string]string{testAutoResume: "true"}, false,
			`resume on request is off: ` + testAutoResume + `: "false" on the Sandbox ("true" turns it on, served ` +
				`by a router running --sandbox-lifecycle)`},
	} {
		annotations := map[string]string{"agents.x-k8s.io/sandbox-template-ref": "tpl"}
		if tc.noRef {
			annotations = map[string]string{}
		}
		for k, v := range tc.own {
			annotations[k] = v
		}
		sb := sandboxObj("10.1.1.1", "Suspended", false)
		sb.SetAnnotations(annotations)
		url, _ := routerAnswering(t, http.StatusBadGateway, `{"detail":"Could not connect to the backend sandbox: sb"}`)
		for _, disable := range []bool{false, true} {
			s := clusterHandle(t, Options{APIURL: url, DisablePodIPRouting: disable}, sandboxInfo{podName: "sb", podIP: "10.1.1.1"}, sb)
			dyn := fakeDynamic(s)
			if tc.template != nil {
				tpl := unstructuredObj("extensions.agents.x-k8s.io/v1beta1", "SandboxTemplate", "tpl", nil)
				tpl.SetAnnotations(tc.template)
				if err := dyn.Tracker().Create(testTemplatesGVR, tpl, "ns"); err != nil {
					t.Fatal(err)
				}
			}
			if tc.forbidden {
				dyn.PrependReactor("get", "sandboxtemplates", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(testTemplatesGVR.GroupResource(), "tpl", errors.New("no grant"))
				})
			}
			checks := map[string]func() error{
				"run":    func() error { _, err := s.Run(context.Background(), "true"); return err },
				"exists": func() error { _, err := s.Exists(context.Background(), "a"); return err },
				"readPodIP": func() error { // the X-Sandbox-Pod-IP re-read after a 502
					_, err := s.readPodIP(context.Background(), "sb")
					return err
				},
			}
			for call, fn := range checks {
				err := fn()
				text := ""
				if err != nil {
					text = err.Error()
				}
				if !errors.Is(err, ErrNotReady) || !strings.Contains(text, "is suspended (spec.operatingMode: Suspended): call Resume") {
					t.Errorf("%s, %s, DisablePodIPRouting %v: %v; want ErrNotReady naming the suspension", tc.name, call, disable, err)
					continue
				}
				if !strings.Contains(text, tc.want) || strings.Contains(text, "or run the router with --sandbox-lifecycle") {
					t.Errorf("%s, %s, DisablePodIPRouting %v: %v\n  want it to say %q", tc.name, call, disable, err, tc.want)
				}
			}
		}
	}
}

// The advice is read on the failure path only, at most one template read per explanation.
func TestTheSuspendedAdviceReadsTheTemplateOnlyWhenItMatters(t *testing.T) {
	sb := sandboxObj("127.0.0.1", "Suspended", false)
	sb.SetAnnotations(map[string]string{"agents.x-k8s.io/sandbox-template-ref": "tpl", testAutoResume: "true"})
	s := clusterHandle(t, Options{Connectivity: ConnectivityInCluster, ServerPort: closedPort(t)},
		sandboxInfo{podName: "sb", podIP: "127.0.0.1"}, sb)
	_, err := s.Run(context.Background(), "true")
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), `on the Sandbox), but this request did not go through`) {
		t.Fatalf("Run = %v", err)
	}
	for _, a := range fakeDynamic(s).Actions() {
		if a.GetResource().Resource == "sandboxtemplates" {
			t.Errorf("the template was read (%s) although the Sandbox sets auto-resume itself", a.GetVerb())
		}
	}
}
