package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// customKind is one kind that a CRD declares.
type customKind struct {
	crd        string
	namespaced bool
	versions   map[string]*customVersion
}

// customVersion is one version of a custom kind with the API server's view of its schema.
type customVersion struct {
	served     bool
	structural *structuralschema.Structural
	validator  apiservervalidation.SchemaValidator
	// rules are the schema's compiled x-kubernetes-validations (CEL); nil when it has none.
	rules *cel.Validator
}

// loadCRDs loads every CustomResourceDefinition in a YAML file or in the *.yaml/*.yml files of
// a folder. The CRDs themselves are decoded strictly, so a mangled schema file fails loudly.
func (c *Checker) loadCRDs(path string) error {
	files := []string{path}
	if info, err := os.Stat(path); err != nil {
		return err
	} else if info.IsDir() {
		files = nil
		for _, pattern := range []string{"*.yaml", "*.yml"} {
			found, _ := filepath.Glob(filepath.Join(path, pattern))
			files = append(files, found...)
		}
		if len(files) == 0 {
			return fmt.Errorf("-crds %s: no *.yaml files in the folder", path)
		}
	}
	for _, file := range files {
		if err := c.loadCRDFile(file); err != nil {
			return fmt.Errorf("-crds %s: %w", file, err)
		}
	}
	return nil
}

func (c *Checker) loadCRDFile(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	docs, err := splitDocuments(data)
	if err != nil {
		return err
	}
	for _, doc := range docs {
		jsonDoc, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return err
		}
		obj, _, err := c.decoder.Decode(jsonDoc, nil, nil)
		if err != nil {
			return err
		}
		crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
		if !ok {
			return fmt.Errorf("holds a %T, not an apiextensions.k8s.io/v1 CustomResourceDefinition", obj)
		}
		kind, err := newCustomKind(crd)
		if err != nil {
			return fmt.Errorf("CRD %s: %w", crd.Name, err)
		}
		c.custom[schema.GroupKind{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind}] = kind
	}
	return nil
}

// newCustomKind prepares each version's schema the way the API server's custom resource
// handler does: the v1 schema converted to the internal form, its structural form (for
// pruning, i.e. finding unknown fields), the OpenAPI validator and the compiled CEL rules.
func newCustomKind(crd *apiextensionsv1.CustomResourceDefinition) (*customKind, error) {
	kind := &customKind{
		crd:        crd.Name,
		namespaced: crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
		versions:   map[string]*customVersion{},
	}
	for _, v := range crd.Spec.Versions {
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			return nil, fmt.Errorf("version %s has no openAPIV3Schema", v.Name)
		}
		internal := &apiextensions.JSONSchemaProps{}
		if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(
			v.Schema.OpenAPIV3Schema, internal, nil); err != nil {
			return nil, err
		}
		structural, err := structuralschema.NewStructural(internal)
		if err != nil {
			return nil, fmt.Errorf("version %s: schema is not structural: %w", v.Name, err)
		}
		validator, _, err := apiservervalidation.NewSchemaValidator(internal)
		if err != nil {
			return nil, fmt.Errorf("version %s: %w", v.Name, err)
		}
		kind.versions[v.Name] = &customVersion{
			served: v.Served, structural: structural, validator: validator,
			rules: cel.NewValidator(structural, true, celconfig.PerCallLimit),
		}
	}
	return kind, nil
}

// servedVersions lists the versions the CRD serves, for error messages.
func (k *customKind) servedVersions() string {
	var served []string
	for name, v := range k.versions {
		if v.served {
			served = append(served, name)
		}
	}
	sort.Strings(served)
	return strings.Join(served, ", ")
}

// check validates one custom resource (as JSON) against the schema of its version.
func (k *customKind) check(data []byte, version string) []string {
	v := k.versions[version]
	if v == nil || !v.served {
		return []string{fmt.Sprintf("version %q is not served by CRD %s (it serves: %s)",
			version, k.crd, k.servedVersions())}
	}
	var obj map[string]interface{}
	// utiljson decodes numbers as int64 or float64, as the API server does for custom resources.
	if err := utiljson.Unmarshal(data, &obj); err != nil {
		return []string{err.Error()}
	}
	meta, _, unknownMeta, err := objectmeta.GetObjectMetaWithOptions(obj,
		objectmeta.ObjectMetaOptions{ReturnUnknownFieldPaths: true})
	if err != nil {
		return []string{"metadata: " + err.Error()}
	}
	var problems []string
	unknown := append(unknownMeta, pruning.PruneWithOptions(obj, v.structural, true,
		structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})...)
	fieldErr, unknownEmbedded := objectmeta.CoerceWithOptions(nil, obj, v.structural, false,
		objectmeta.CoerceOptions{ReturnUnknownFieldPaths: true})
	for _, path := range append(unknown, unknownEmbedded...) {
		problems = append(problems, fmt.Sprintf("unknown field %q", path))
	}
	errs := field.ErrorList{}
	if fieldErr != nil {
		errs = append(errs, fieldErr)
	}
	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, obj, v.validator)...)
	errs = append(errs, objectmeta.Validate(context.Background(), nil, obj, v.structural, false)...)
	errs = append(errs, listtype.ValidateListSetsAndMaps(nil, v.structural, obj)...)
	errs = append(errs, v.celRules(obj, errs)...)
	if meta == nil {
		errs = append(errs, field.Required(field.NewPath("metadata"), ""))
	} else {
		errs = append(errs, validateMeta(meta, k.namespaced, metavalidation.NameIsDNSSubdomain)...)
	}
	for _, e := range errs {
		problems = append(problems, e.Error())
	}
	return problems
}

// celRules evaluates the x-kubernetes-validations rules, as the API server does only when the
// schema validation found nothing that would make them meaningless (its hasBlockingErr).
func (v *customVersion) celRules(obj map[string]interface{}, errs field.ErrorList) field.ErrorList {
	if v.rules == nil {
		return nil
	}
	for _, e := range errs {
		switch e.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong,
			field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return field.ErrorList{field.Invalid(nil, nil,
				"some validation rules were not checked because the object was invalid; correct the existing errors to complete validation")}
		}
	}
	ruleErrs, _ := v.rules.Validate(context.Background(), nil, v.structural, obj, nil, celconfig.RuntimeCELCostBudget)
	return ruleErrs
}
