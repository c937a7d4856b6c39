// Package v2 is the API group example.kinformer.dev/v2: the Website kind.
// +kubebuilder:object:generate=true
// +groupName=example.kinformer.dev
package v2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// SchemeGroupVersion is the group and version of this package's types.
	SchemeGroupVersion = schema.GroupVersion{Group: "example.kinformer.dev", Version: "v2"}
	// SchemeBuilder adds this package's types to a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &Website{}, &WebsiteList{})
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
