package main

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// builtinScheme registers the generally available (GA) version of every built-in group that a
// manifest can hold. Beta and alpha versions are left out on purpose: a removed beta API (e.g.
// policy/v1beta1) or one that clusters do not serve by default must fail the check, not pass it.
func builtinScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		admissionregistrationv1.AddToScheme,
		apiextensionsv1.AddToScheme,
		appsv1.AddToScheme,
		autoscalingv1.AddToScheme,
		autoscalingv2.AddToScheme,
		batchv1.AddToScheme,
		certificatesv1.AddToScheme,
		coordinationv1.AddToScheme,
		corev1.AddToScheme,
		discoveryv1.AddToScheme,
		eventsv1.AddToScheme,
		flowcontrolv1.AddToScheme,
		networkingv1.AddToScheme,
		nodev1.AddToScheme,
		policyv1.AddToScheme,
		rbacv1.AddToScheme,
		resourcev1.AddToScheme,
		schedulingv1.AddToScheme,
		storagev1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return scheme, nil
}

// clusterScoped names the built-in kinds that live outside namespaces; every other built-in
// kind is namespaced.
var clusterScoped = map[string]bool{
	"APIService": true, "CertificateSigningRequest": true, "ClusterRole": true,
	"ClusterRoleBinding": true, "CSIDriver": true, "CSINode": true,
	"CustomResourceDefinition": true, "DeviceClass": true, "FlowSchema": true,
	"IngressClass": true, "MutatingWebhookConfiguration": true, "Namespace": true, "Node": true,
	"PersistentVolume": true, "PriorityClass": true, "PriorityLevelConfiguration": true,
	"ResourceSlice": true, "RuntimeClass": true, "StorageClass": true,
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
	"ValidatingWebhookConfiguration": true, "VolumeAttachment": true,
}
