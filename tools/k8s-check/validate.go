package main

// The cheap part of the API server's validation, for the kinds a manifest of this project holds.
// The full validation lives in k8s.io/kubernetes (pkg/apis/*/validation) and runs on internal
// types behind conversion and defaulting: importing it means building most of Kubernetes, so the
// rules below restate the ones that catch manifest mistakes, with the API server's field paths
// and messages (k8s.io/apimachinery's field.ErrorList) and its own name, label, selector, port
// and key validators.

import (
	"fmt"
	"reflect"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validateBuiltin validates a strictly decoded built-in object.
func validateBuiltin(obj runtime.Object) field.ErrorList {
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	errs := field.ErrorList{}
	if accessor, ok := obj.(metav1.ObjectMetaAccessor); ok {
		errs = append(errs, validateMeta(accessor.GetObjectMeta(), !clusterScoped[kind], nameRule(kind))...)
	}
	spec := field.NewPath("spec")
	switch o := obj.(type) {
	case *appsv1.Deployment:
		errs = append(errs, validateWorkload(o.Spec.Replicas, o.Spec.Selector, &o.Spec.Template, spec)...)
	case *appsv1.StatefulSet:
		errs = append(errs, validateWorkload(o.Spec.Replicas, o.Spec.Selector, &o.Spec.Template, spec,
			claimNames(o.Spec.VolumeClaimTemplates)...)...)
		errs = append(errs, validateClaimTemplates(o.Spec.VolumeClaimTemplates, spec.Child("volumeClaimTemplates"))...)
	case *appsv1.DaemonSet:
		errs = append(errs, validateWorkload(nil, o.Spec.Selector, &o.Spec.Template, spec)...)
	case *appsv1.ReplicaSet:
		errs = append(errs, validateWorkload(o.Spec.Replicas, o.Spec.Selector, &o.Spec.Template, spec)...)
	case *batchv1.Job:
		errs = append(errs, validateJobTemplate(&o.Spec.Template, spec.Child("template"))...)
	case *batchv1.CronJob:
		if o.Spec.Schedule == "" {
			errs = append(errs, field.Required(spec.Child("schedule"), ""))
		}
		errs = append(errs, validateJobTemplate(&o.Spec.JobTemplate.Spec.Template,
			spec.Child("jobTemplate", "spec", "template"))...)
	case *corev1.Pod:
		errs = append(errs, validatePodSpec(&o.Spec, spec)...)
	case *corev1.Service:
		errs = append(errs, validateService(&o.Spec, spec)...)
	case *corev1.ConfigMap:
		errs = append(errs, validateKeys(o.Data, o.BinaryData, field.NewPath("data"))...)
	case *corev1.Secret:
		errs = append(errs, validateKeys(o.StringData, o.Data, field.NewPath("data"))...)
	case *corev1.PersistentVolumeClaim:
		errs = append(errs, validateClaimSpec(&o.Spec, spec)...)
	case *policyv1.PodDisruptionBudget:
		errs = append(errs, validatePDB(&o.Spec, spec)...)
	case *autoscalingv2.HorizontalPodAutoscaler:
		errs = append(errs, validateHPA(&o.Spec, spec)...)
	case *networkingv1.NetworkPolicy:
		errs = append(errs, validateNetworkPolicy(&o.Spec, spec)...)
	case *networkingv1.Ingress:
		errs = append(errs, validateIngress(&o.Spec, spec)...)
	case *rbacv1.Role:
		errs = append(errs, validateRules(o.Rules, field.NewPath("rules"))...)
	case *rbacv1.ClusterRole:
		errs = append(errs, validateRules(o.Rules, field.NewPath("rules"))...)
	case *rbacv1.RoleBinding:
		errs = append(errs, validateBinding(o.RoleRef, o.Subjects)...)
	case *rbacv1.ClusterRoleBinding:
		errs = append(errs, validateBinding(o.RoleRef, o.Subjects)...)
	}
	return errs
}

// nameRule is the API server's rule for a kind's metadata.name.
func nameRule(kind string) metavalidation.ValidateNameFunc {
	switch kind {
	case "Service":
		return metavalidation.NameIsDNS1035Label
	case "Namespace":
		return metavalidation.ValidateNamespaceName
	}
	return metavalidation.NameIsDNSSubdomain
}

// validateMeta validates metadata: name, labels, annotations, and a namespace only where the
// kind is namespaced. A namespaced object without a namespace is fine in a manifest (the
// client fills in its default), so the check then uses a placeholder.
func validateMeta(meta metav1.Object, namespaced bool, nameFn metavalidation.ValidateNameFunc) field.ErrorList {
	if om, ok := meta.(*metav1.ObjectMeta); ok && namespaced && om.Namespace == "" {
		om = om.DeepCopy()
		om.Namespace = "default"
		meta = om
	}
	return metavalidation.ValidateObjectMetaAccessor(meta, namespaced, nameFn, field.NewPath("metadata"))
}

// validateSelector validates a label selector; required ones must not be empty.
func validateSelector(sel *metav1.LabelSelector, required bool, path *field.Path) field.ErrorList {
	if sel == nil {
		if required {
			return field.ErrorList{field.Required(path, "")}
		}
		return nil
	}
	errs := metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, path)
	if required && len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
		errs = append(errs, field.Invalid(path, sel, "empty selector is invalid for this kind"))
	}
	return errs
}

// validateWorkload validates an apps/v1 workload: replicas, a selector that matches the pod
// template's labels, and the pod template, whose pods must restart Always. claims are the
// names of a StatefulSet's volume claim templates, which its containers may mount.
func validateWorkload(replicas *int32, sel *metav1.LabelSelector, tmpl *corev1.PodTemplateSpec,
	spec *field.Path, claims ...string) field.ErrorList {
	errs := validateSelector(sel, true, spec.Child("selector"))
	if replicas != nil && *replicas < 0 {
		errs = append(errs, field.Invalid(spec.Child("replicas"), *replicas, "must be greater than or equal to 0"))
	}
	tmplPath := spec.Child("template")
	if len(errs) == 0 {
		selector, err := metav1.LabelSelectorAsSelector(sel)
		if err == nil && !selector.Matches(labels.Set(tmpl.Labels)) {
			errs = append(errs, field.Invalid(tmplPath.Child("metadata", "labels"), tmpl.Labels,
				"`selector` does not match template `labels`"))
		}
	}
	errs = append(errs, metav1validation.ValidateLabels(tmpl.Labels, tmplPath.Child("metadata", "labels"))...)
	if p := tmpl.Spec.RestartPolicy; p != "" && p != corev1.RestartPolicyAlways {
		errs = append(errs, field.NotSupported(tmplPath.Child("spec", "restartPolicy"), p, []string{"Always"}))
	}
	return append(errs, validatePodSpec(&tmpl.Spec, tmplPath.Child("spec"), claims...)...)
}

func claimNames(claims []corev1.PersistentVolumeClaim) []string {
	names := make([]string, 0, len(claims))
	for i := range claims {
		names = append(names, claims[i].Name)
	}
	return names
}

// validateJobTemplate validates a Job's pod template, whose pods must not restart Always.
func validateJobTemplate(tmpl *corev1.PodTemplateSpec, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	p := tmpl.Spec.RestartPolicy
	if p != corev1.RestartPolicyOnFailure && p != corev1.RestartPolicyNever {
		errs = append(errs, field.NotSupported(path.Child("spec", "restartPolicy"), p, []string{"OnFailure", "Never"}))
	}
	return append(errs, validatePodSpec(&tmpl.Spec, path.Child("spec"))...)
}

// validatePodSpec validates volumes, containers (names unique across all of them) and the
// service account name; claims are further volume names the containers may mount.
func validatePodSpec(spec *corev1.PodSpec, path *field.Path, claims ...string) field.ErrorList {
	errs := field.ErrorList{}
	volumes, verrs := validateVolumes(spec.Volumes, path.Child("volumes"))
	volumes.Insert(claims...)
	errs = append(errs, verrs...)
	if len(spec.Containers) == 0 {
		errs = append(errs, field.Required(path.Child("containers"), ""))
	}
	names := sets.New[string]()
	for _, group := range []struct {
		name       string
		containers []corev1.Container
	}{{"initContainers", spec.InitContainers}, {"containers", spec.Containers}} {
		for i := range group.containers {
			c := &group.containers[i]
			cPath := path.Child(group.name).Index(i)
			if names.Has(c.Name) {
				errs = append(errs, field.Duplicate(cPath.Child("name"), c.Name))
			}
			names.Insert(c.Name)
			errs = append(errs, validateContainer(c, volumes, cPath)...)
		}
	}
	if spec.ServiceAccountName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(spec.ServiceAccountName) {
			errs = append(errs, field.Invalid(path.Child("serviceAccountName"), spec.ServiceAccountName, msg))
		}
	}
	return errs
}

// validateVolumes checks names (DNS labels, unique) and that each volume has exactly one
// source; it returns the set of names for the containers' volume mounts.
func validateVolumes(volumes []corev1.Volume, path *field.Path) (sets.Set[string], field.ErrorList) {
	names := sets.New[string]()
	errs := field.ErrorList{}
	for i := range volumes {
		v := &volumes[i]
		vPath := path.Index(i)
		errs = append(errs, dnsLabel(v.Name, vPath.Child("name"))...)
		if names.Has(v.Name) {
			errs = append(errs, field.Duplicate(vPath.Child("name"), v.Name))
		}
		names.Insert(v.Name)
		if n := setPointers(v.VolumeSource); n != 1 {
			errs = append(errs, field.Invalid(vPath, v.Name, fmt.Sprintf("must specify exactly 1 volume source, found %d", n)))
		}
	}
	return names, errs
}

// setPointers counts the non-nil pointer fields of a struct: the "one of" members of a union.
func setPointers(union any) int {
	v := reflect.ValueOf(union)
	n := 0
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			n++
		}
	}
	return n
}

// validateContainer checks one container: name, image, ports, env, mounts, probes, resources.
func validateContainer(c *corev1.Container, volumes sets.Set[string], path *field.Path) field.ErrorList {
	errs := dnsLabel(c.Name, path.Child("name"))
	if c.Image == "" {
		errs = append(errs, field.Required(path.Child("image"), ""))
	}
	portNames := sets.New[string]()
	for i, p := range c.Ports {
		pPath := path.Child("ports").Index(i)
		errs = append(errs, portNumber(int(p.ContainerPort), pPath.Child("containerPort"))...)
		errs = append(errs, protocol(p.Protocol, pPath.Child("protocol"))...)
		if p.Name != "" {
			errs = append(errs, portName(p.Name, pPath.Child("name"))...)
			if portNames.Has(p.Name) {
				errs = append(errs, field.Duplicate(pPath.Child("name"), p.Name))
			}
			portNames.Insert(p.Name)
		}
	}
	for i := range c.Env {
		errs = append(errs, validateEnv(&c.Env[i], path.Child("env").Index(i))...)
	}
	mountPaths := sets.New[string]()
	for i, m := range c.VolumeMounts {
		mPath := path.Child("volumeMounts").Index(i)
		if !volumes.Has(m.Name) {
			errs = append(errs, field.NotFound(mPath.Child("name"), m.Name))
		}
		if m.MountPath == "" {
			errs = append(errs, field.Required(mPath.Child("mountPath"), ""))
		} else if mountPaths.Has(m.MountPath) {
			errs = append(errs, field.Invalid(mPath.Child("mountPath"), m.MountPath, "must be unique"))
		}
		mountPaths.Insert(m.MountPath)
	}
	for name, probe := range map[string]*corev1.Probe{
		"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe, "startupProbe": c.StartupProbe,
	} {
		errs = append(errs, validateProbe(probe, path.Child(name))...)
	}
	return append(errs, validateResources(&c.Resources, path.Child("resources"))...)
}

// validateEnv checks a variable's name and that it has a value or exactly one source.
func validateEnv(e *corev1.EnvVar, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	if e.Name == "" {
		errs = append(errs, field.Required(path.Child("name"), ""))
	} else {
		for _, msg := range validation.IsRelaxedEnvVarName(e.Name) {
			errs = append(errs, field.Invalid(path.Child("name"), e.Name, msg))
		}
	}
	if e.ValueFrom == nil {
		return errs
	}
	if e.Value != "" {
		errs = append(errs, field.Invalid(path.Child("valueFrom"), "",
			"may not be specified when `value` is not empty"))
	}
	if n := setPointers(*e.ValueFrom); n != 1 {
		errs = append(errs, field.Invalid(path.Child("valueFrom"), "",
			fmt.Sprintf("must specify exactly one source, found %d", n)))
	}
	for _, ref := range []*corev1.LocalObjectReference{configMapRef(e.ValueFrom), secretRef(e.ValueFrom)} {
		if ref != nil && ref.Name == "" {
			errs = append(errs, field.Required(path.Child("valueFrom", "name"), ""))
		}
	}
	return errs
}

func configMapRef(s *corev1.EnvVarSource) *corev1.LocalObjectReference {
	if s.ConfigMapKeyRef == nil {
		return nil
	}
	return &s.ConfigMapKeyRef.LocalObjectReference
}

func secretRef(s *corev1.EnvVarSource) *corev1.LocalObjectReference {
	if s.SecretKeyRef == nil {
		return nil
	}
	return &s.SecretKeyRef.LocalObjectReference
}

// validateProbe checks that a probe has exactly one handler on a valid port.
func validateProbe(p *corev1.Probe, path *field.Path) field.ErrorList {
	if p == nil {
		return nil
	}
	errs := field.ErrorList{}
	if n := setPointers(p.ProbeHandler); n != 1 {
		errs = append(errs, field.Invalid(path, "", fmt.Sprintf("must specify exactly one handler, found %d", n)))
	}
	if h := p.HTTPGet; h != nil {
		errs = append(errs, portNumOrName(h.Port, path.Child("httpGet", "port"))...)
	}
	if t := p.TCPSocket; t != nil {
		errs = append(errs, portNumOrName(t.Port, path.Child("tcpSocket", "port"))...)
	}
	if g := p.GRPC; g != nil {
		errs = append(errs, portNumber(int(g.Port), path.Child("grpc", "port"))...)
	}
	for name, v := range map[string]int32{
		"initialDelaySeconds": p.InitialDelaySeconds, "timeoutSeconds": p.TimeoutSeconds,
		"periodSeconds": p.PeriodSeconds, "successThreshold": p.SuccessThreshold,
		"failureThreshold": p.FailureThreshold,
	} {
		if v < 0 {
			errs = append(errs, field.Invalid(path.Child(name), v, "must be greater than or equal to 0"))
		}
	}
	return errs
}

// validateResources checks that no request exceeds its limit.
func validateResources(r *corev1.ResourceRequirements, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	for name, request := range r.Requests {
		if limit, ok := r.Limits[name]; ok && request.Cmp(limit) > 0 {
			errs = append(errs, field.Invalid(path.Child("requests").Key(string(name)), request.String(),
				fmt.Sprintf("must be less than or equal to %s limit of %s", name, limit.String())))
		}
	}
	return errs
}

// validateService checks type, ports (valid, named when several, unique) and selector labels.
func validateService(s *corev1.ServiceSpec, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	switch s.Type {
	case "", corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
		if len(s.Ports) == 0 && s.ClusterIP != corev1.ClusterIPNone {
			errs = append(errs, field.Required(path.Child("ports"), ""))
		}
	case corev1.ServiceTypeExternalName:
		if s.ExternalName == "" {
			errs = append(errs, field.Required(path.Child("externalName"), ""))
		}
	default:
		errs = append(errs, field.NotSupported(path.Child("type"), s.Type,
			[]string{"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"}))
	}
	names := sets.New[string]()
	for i, p := range s.Ports {
		pPath := path.Child("ports").Index(i)
		if len(s.Ports) > 1 && p.Name == "" {
			errs = append(errs, field.Required(pPath.Child("name"), "required when more than one port"))
		}
		if p.Name != "" {
			errs = append(errs, dnsLabel(p.Name, pPath.Child("name"))...)
			if names.Has(p.Name) {
				errs = append(errs, field.Duplicate(pPath.Child("name"), p.Name))
			}
			names.Insert(p.Name)
		}
		errs = append(errs, portNumber(int(p.Port), pPath.Child("port"))...)
		errs = append(errs, protocol(p.Protocol, pPath.Child("protocol"))...)
		if p.TargetPort.Type == intstr.String || p.TargetPort.IntValue() != 0 {
			errs = append(errs, portNumOrName(p.TargetPort, pPath.Child("targetPort"))...)
		}
	}
	return append(errs, metav1validation.ValidateLabels(s.Selector, path.Child("selector"))...)
}

// validateKeys checks ConfigMap/Secret keys and that no key is in both maps.
func validateKeys[A, B any](first map[string]A, second map[string]B, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	for key := range first {
		for _, msg := range validation.IsConfigMapKey(key) {
			errs = append(errs, field.Invalid(path.Key(key), key, msg))
		}
	}
	for key := range second {
		for _, msg := range validation.IsConfigMapKey(key) {
			errs = append(errs, field.Invalid(path.Key(key), key, msg))
		}
	}
	return errs
}

// validateClaimSpec checks that a claim has access modes and a storage request.
func validateClaimSpec(s *corev1.PersistentVolumeClaimSpec, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	if len(s.AccessModes) == 0 {
		errs = append(errs, field.Required(path.Child("accessModes"), "at least 1 access mode is required"))
	}
	if _, ok := s.Resources.Requests[corev1.ResourceStorage]; !ok {
		errs = append(errs, field.Required(path.Child("resources").Key(string(corev1.ResourceStorage)), ""))
	}
	return errs
}

func validateClaimTemplates(claims []corev1.PersistentVolumeClaim, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	for i := range claims {
		errs = append(errs, dnsLabel(claims[i].Name, path.Index(i).Child("metadata", "name"))...)
		errs = append(errs, validateClaimSpec(&claims[i].Spec, path.Index(i).Child("spec"))...)
	}
	return errs
}

// validatePDB checks that a budget says one of minAvailable/maxUnavailable, and its selector.
func validatePDB(s *policyv1.PodDisruptionBudgetSpec, path *field.Path) field.ErrorList {
	errs := validateSelector(s.Selector, false, path.Child("selector"))
	if s.MinAvailable != nil && s.MaxUnavailable != nil {
		errs = append(errs, field.Invalid(path, s, "minAvailable and maxUnavailable cannot be both set"))
	}
	for name, v := range map[string]*intstr.IntOrString{"minAvailable": s.MinAvailable, "maxUnavailable": s.MaxUnavailable} {
		if v != nil && v.Type == intstr.Int && v.IntValue() < 0 {
			errs = append(errs, field.Invalid(path.Child(name), v.IntValue(), "must be greater than or equal to 0"))
		}
	}
	return errs
}

// validateHPA checks the target, the replica bounds and that each metric has its source.
func validateHPA(s *autoscalingv2.HorizontalPodAutoscalerSpec, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	ref := path.Child("scaleTargetRef")
	if s.ScaleTargetRef.Kind == "" {
		errs = append(errs, field.Required(ref.Child("kind"), ""))
	}
	if s.ScaleTargetRef.Name == "" {
		errs = append(errs, field.Required(ref.Child("name"), ""))
	}
	if s.MinReplicas != nil && *s.MinReplicas < 1 {
		errs = append(errs, field.Invalid(path.Child("minReplicas"), *s.MinReplicas, "must be greater than or equal to 1"))
	}
	if s.MaxReplicas < 1 {
		errs = append(errs, field.Invalid(path.Child("maxReplicas"), s.MaxReplicas, "must be greater than or equal to 1"))
	}
	if s.MinReplicas != nil && s.MaxReplicas < *s.MinReplicas {
		errs = append(errs, field.Invalid(path.Child("maxReplicas"), s.MaxReplicas, "must be greater than or equal to `minReplicas`"))
	}
	for i, m := range s.Metrics {
		mPath := path.Child("metrics").Index(i)
		sources := map[autoscalingv2.MetricSourceType]bool{
			autoscalingv2.ObjectMetricSourceType:            m.Object != nil,
			autoscalingv2.PodsMetricSourceType:              m.Pods != nil,
			autoscalingv2.ResourceMetricSourceType:          m.Resource != nil,
			autoscalingv2.ContainerResourceMetricSourceType: m.ContainerResource != nil,
			autoscalingv2.ExternalMetricSourceType:          m.External != nil,
		}
		if _, known := sources[m.Type]; !known {
			errs = append(errs, field.NotSupported(mPath.Child("type"), m.Type,
				[]string{"ContainerResource", "External", "Object", "Pods", "Resource"}))
			continue
		}
		if setPointers(m) != 1 || !sources[m.Type] {
			errs = append(errs, field.Invalid(mPath, m.Type, "must populate exactly the source matching `type`"))
		}
	}
	return errs
}

// validateNetworkPolicy checks selectors, ports and policy types.
func validateNetworkPolicy(s *networkingv1.NetworkPolicySpec, path *field.Path) field.ErrorList {
	errs := validateSelector(&s.PodSelector, false, path.Child("podSelector"))
	checkPorts := func(ports []networkingv1.NetworkPolicyPort, p *field.Path) {
		for i, port := range ports {
			if port.Protocol != nil {
				errs = append(errs, protocol(*port.Protocol, p.Index(i).Child("protocol"))...)
			}
			if port.Port != nil {
				errs = append(errs, portNumOrName(*port.Port, p.Index(i).Child("port"))...)
			}
		}
	}
	checkPeers := func(peers []networkingv1.NetworkPolicyPeer, p *field.Path) {
		for i, peer := range peers {
			errs = append(errs, validateSelector(peer.PodSelector, false, p.Index(i).Child("podSelector"))...)
			errs = append(errs, validateSelector(peer.NamespaceSelector, false, p.Index(i).Child("namespaceSelector"))...)
			if peer.PodSelector == nil && peer.NamespaceSelector == nil && peer.IPBlock == nil {
				errs = append(errs, field.Required(p.Index(i), "must specify a peer"))
			}
		}
	}
	for i, rule := range s.Ingress {
		checkPorts(rule.Ports, path.Child("ingress").Index(i).Child("ports"))
		checkPeers(rule.From, path.Child("ingress").Index(i).Child("from"))
	}
	for i, rule := range s.Egress {
		checkPorts(rule.Ports, path.Child("egress").Index(i).Child("ports"))
		checkPeers(rule.To, path.Child("egress").Index(i).Child("to"))
	}
	for i, t := range s.PolicyTypes {
		if t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress {
			errs = append(errs, field.NotSupported(path.Child("policyTypes").Index(i), t, []string{"Ingress", "Egress"}))
		}
	}
	return errs
}

// validateIngress checks each path's type and backend, and TLS hosts.
func validateIngress(s *networkingv1.IngressSpec, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	if s.DefaultBackend != nil {
		errs = append(errs, validateBackend(s.DefaultBackend, path.Child("defaultBackend"))...)
	}
	for i, rule := range s.Rules {
		rPath := path.Child("rules").Index(i)
		if rule.Host != "" {
			for _, msg := range validation.IsDNS1123Subdomain(rule.Host) {
				errs = append(errs, field.Invalid(rPath.Child("host"), rule.Host, msg))
			}
		}
		if rule.HTTP == nil {
			continue
		}
		for j, p := range rule.HTTP.Paths {
			pPath := rPath.Child("http", "paths").Index(j)
			if p.PathType == nil {
				errs = append(errs, field.Required(pPath.Child("pathType"), "pathType must be specified"))
			} else if t := *p.PathType; t != networkingv1.PathTypeExact && t != networkingv1.PathTypePrefix &&
				t != networkingv1.PathTypeImplementationSpecific {
				errs = append(errs, field.NotSupported(pPath.Child("pathType"), t,
					[]string{"Exact", "Prefix", "ImplementationSpecific"}))
			}
			errs = append(errs, validateBackend(&p.Backend, pPath.Child("backend"))...)
		}
	}
	return errs
}

func validateBackend(b *networkingv1.IngressBackend, path *field.Path) field.ErrorList {
	if (b.Service == nil) == (b.Resource == nil) {
		return field.ErrorList{field.Invalid(path, "", "must specify exactly one of service or resource")}
	}
	if b.Service == nil {
		return nil
	}
	errs := dnsLabel(b.Service.Name, path.Child("service", "name"))
	port := b.Service.Port
	if (port.Name == "") == (port.Number == 0) {
		errs = append(errs, field.Invalid(path.Child("service", "port"), port, "must specify exactly one of name or number"))
	} else if port.Name != "" {
		errs = append(errs, portName(port.Name, path.Child("service", "port", "name"))...)
	} else {
		errs = append(errs, portNumber(int(port.Number), path.Child("service", "port", "number"))...)
	}
	return errs
}

// validateRules checks that each RBAC rule names verbs.
func validateRules(rules []rbacv1.PolicyRule, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	for i, r := range rules {
		if len(r.Verbs) == 0 {
			errs = append(errs, field.Required(path.Index(i).Child("verbs"), "verbs must contain at least one value"))
		}
	}
	return errs
}

// validateBinding checks the role reference and the subjects.
func validateBinding(ref rbacv1.RoleRef, subjects []rbacv1.Subject) field.ErrorList {
	errs := field.ErrorList{}
	refPath := field.NewPath("roleRef")
	if ref.Kind != "Role" && ref.Kind != "ClusterRole" {
		errs = append(errs, field.NotSupported(refPath.Child("kind"), ref.Kind, []string{"Role", "ClusterRole"}))
	}
	if ref.Name == "" {
		errs = append(errs, field.Required(refPath.Child("name"), ""))
	}
	for i, s := range subjects {
		sPath := field.NewPath("subjects").Index(i)
		if s.Name == "" {
			errs = append(errs, field.Required(sPath.Child("name"), ""))
		}
		if s.Kind != rbacv1.ServiceAccountKind && s.Kind != rbacv1.UserKind && s.Kind != rbacv1.GroupKind {
			errs = append(errs, field.NotSupported(sPath.Child("kind"), s.Kind, []string{"ServiceAccount", "User", "Group"}))
		}
	}
	return errs
}

func dnsLabel(value string, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	if value == "" {
		return append(errs, field.Required(path, ""))
	}
	for _, msg := range validation.IsDNS1123Label(value) {
		errs = append(errs, field.Invalid(path, value, msg))
	}
	return errs
}

func portNumber(port int, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	for _, msg := range validation.IsValidPortNum(port) {
		errs = append(errs, field.Invalid(path, port, msg))
	}
	return errs
}

func portName(name string, path *field.Path) field.ErrorList {
	errs := field.ErrorList{}
	for _, msg := range validation.IsValidPortName(name) {
		errs = append(errs, field.Invalid(path, name, msg))
	}
	return errs
}

func portNumOrName(port intstr.IntOrString, path *field.Path) field.ErrorList {
	if port.Type == intstr.String {
		return portName(port.StrVal, path)
	}
	return portNumber(port.IntValue(), path)
}

func protocol(p corev1.Protocol, path *field.Path) field.ErrorList {
	switch p {
	case "", corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		return nil
	}
	return field.ErrorList{field.NotSupported(path, p, []string{"TCP", "UDP", "SCTP"})}
}
