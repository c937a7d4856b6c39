package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// WebsiteSpec is the desired state of a Website.
type WebsiteSpec struct {
	Image    string `json:"image"`
	Replicas int32  `json:"replicas"`
	Host     string `json:"host,omitempty"` // defaulted by the webhook
}

// WebsiteStatus is the observed state of a Website.
type WebsiteStatus struct {
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
}

// +genclient
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=websites

// Website is a web site: an image served by replicas Pods for host.
type Website struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitzero"`

	Spec   WebsiteSpec   `json:"spec"`
	Status WebsiteStatus `json:"status,omitzero"`
}

// +kubebuilder:object:root=true

// WebsiteList is a list of Websites.
type WebsiteList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitzero"`
	Items           []Website `json:"items"`
}

func init() {
	SchemeBuilder.Register(func(s *runtime.Scheme) error {
		s.AddKnownTypes(SchemeGroupVersion, &Website{}, &WebsiteList{})
		return nil
	})
}
