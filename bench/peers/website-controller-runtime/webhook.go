package main

import (
	"context"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	examplev1 "kinformer.dev/bench/website/api/v1"
)

// +kubebuilder:webhook:path=/mutate-example-kinformer-dev-v1-website,mutating=true,failurePolicy=fail,sideEffects=None,groups=example.kinformer.dev,resources=websites,verbs=create;update,versions=v1,name=mwebsite.kb.io,admissionReviewVersions=v1

// websiteDefaulter gives a Website without a host one from its name.
type websiteDefaulter struct{}

func (d *websiteDefaulter) Default(ctx context.Context, website *examplev1.Website) error {
	if website.Spec.Host == "" {
		website.Spec.Host = website.Name + ".example.com"
	}
	return nil
}

// +kubebuilder:webhook:path=/validate-example-kinformer-dev-v1-website,mutating=false,failurePolicy=fail,sideEffects=None,groups=example.kinformer.dev,resources=websites,verbs=create;update,versions=v1,name=vwebsite.kb.io,admissionReviewVersions=v1

// websiteValidator refuses more than 10 replicas and warns of an image without a tag.
type websiteValidator struct{}

func (v *websiteValidator) validate(website *examplev1.Website) (admission.Warnings, error) {
	replicas, image := website.Spec.Replicas, website.Spec.Image
	if replicas < 0 || replicas > 10 {
		return nil, fmt.Errorf("spec.replicas must be 0 to 10, not %d", replicas)
	}
	if !strings.Contains(image[strings.LastIndex(image, "/")+1:], ":") {
		return admission.Warnings{fmt.Sprintf("spec.image %s has no tag: latest is pulled", image)}, nil
	}
	return nil, nil
}

func (v *websiteValidator) ValidateCreate(ctx context.Context, website *examplev1.Website) (admission.Warnings, error) {
	return v.validate(website)
}

func (v *websiteValidator) ValidateUpdate(ctx context.Context, _, website *examplev1.Website) (admission.Warnings, error) {
	return v.validate(website)
}

func (v *websiteValidator) ValidateDelete(ctx context.Context, _ *examplev1.Website) (admission.Warnings, error) {
	return nil, nil
}
