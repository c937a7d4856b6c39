// Package v2 is the API group example.kinformer.dev/v2: the Website kind,
// registered as kubebuilder v4 scaffolds it (templates/api/group.go).
// +kubebuilder:object:generate=true
// +groupName=example.kinformer.dev
package v2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// SchemeGroupVersion is this package's group and version, under the
	// name the generated apply configurations use.
	SchemeGroupVersion = schema.GroupVersion{Group: "example.kinformer.dev", Version: "v2"}

	// GroupVersion is the same, under kubebuilder's older name.
	GroupVersion = SchemeGroupVersion

	// SchemeBuilder adds this package's types to a scheme (website_types.go
	// registers them).
	SchemeBuilder = runtime.NewSchemeBuilder(func(scheme *runtime.Scheme) error {
		metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
		return nil
	})

	// AddToScheme adds this package's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
