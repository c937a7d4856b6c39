package v2

import (
	"sigs.k8s.io/controller-runtime/pkg/conversion"

	examplev1 "kinformer.dev/bench/website/api/v1"
)

// ConvertTo converts this Website to the hub version, v1.
func (src *Website) ConvertTo(dstRaw conversion.Hub) error {
	dst := dstRaw.(*examplev1.Website)
	dst.ObjectMeta = src.ObjectMeta
	dst.Spec = examplev1.WebsiteSpec{Image: src.Spec.Pods.Image, Replicas: src.Spec.Pods.Replicas, Host: src.Spec.Host}
	dst.Status = examplev1.WebsiteStatus(src.Status)
	return nil
}

// ConvertFrom converts a Website of the hub version, v1, to this version.
func (dst *Website) ConvertFrom(srcRaw conversion.Hub) error {
	src := srcRaw.(*examplev1.Website)
	dst.ObjectMeta = src.ObjectMeta
	dst.Spec = WebsiteSpec{Host: src.Spec.Host, Pods: Pods{Image: src.Spec.Image, Replicas: src.Spec.Replicas}}
	dst.Status = WebsiteStatus(src.Status)
	return nil
}
