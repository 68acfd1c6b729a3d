package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Checker checks documents against the built-in scheme, the loaded CRDs and the allow-list.
type Checker struct {
	scheme  *runtime.Scheme
	decoder runtime.Decoder
	custom  map[schema.GroupKind]*customKind
	allowed map[schema.GroupKind]bool
}

// Report is the outcome of one stream.
type Report struct {
	// Problems are human-readable lines, one per problem found.
	Problems []string
	// Documents counts the stream's documents; BuiltIn, Custom and Allowed count the objects
	// checked each way (the rest could not be classified, which is a problem of its own).
	Documents, BuiltIn, Custom, Allowed int
}

// Summary is the one line printed on standard output.
func (r Report) Summary() string {
	return fmt.Sprintf("k8s-check: %d documents (%d built-in, %d custom resources, %d allowed unchecked), %d problems",
		r.Documents, r.BuiltIn, r.Custom, r.Allowed, len(r.Problems))
}

// header is what every document must say about itself, read leniently so that a problem can be
// reported against the object's name even when strict decoding fails.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

func (h header) String() string {
	name := h.Metadata.Name
	if h.Metadata.Namespace != "" {
		name = h.Metadata.Namespace + "/" + name
	}
	return fmt.Sprintf("%s %s %q", h.APIVersion, h.Kind, name)
}

// NewChecker builds the scheme of built-in types, loads the CRDs and parses the allow-list.
func NewChecker(crdPaths, allowed []string) (*Checker, error) {
	scheme, err := builtinScheme()
	if err != nil {
		return nil, err
	}
	c := &Checker{
		scheme: scheme,
		// Strict: unknown and duplicate fields are errors, as with kubectl --validate=strict.
		decoder: serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer(),
		custom:  map[schema.GroupKind]*customKind{},
		allowed: map[schema.GroupKind]bool{},
	}
	for _, path := range crdPaths {
		if err := c.loadCRDs(path); err != nil {
			return nil, err
		}
	}
	for _, a := range allowed {
		group, kind, ok := strings.Cut(a, "/")
		if !ok || kind == "" {
			return nil, fmt.Errorf("-allow %q: want GROUP/KIND", a)
		}
		c.allowed[schema.GroupKind{Group: group, Kind: kind}] = true
	}
	return c, nil
}

// splitDocuments splits a YAML stream at its document separators, dropping empty documents.
func splitDocuments(data []byte) ([][]byte, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			docs = append(docs, doc)
		}
	}
}

// stripComments drops whole-line comments, so that a document of only comments counts as empty.
func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// CheckStream checks every document of a YAML stream.
func (c *Checker) CheckStream(data []byte) (Report, error) {
	var report Report
	docs, err := splitDocuments(data)
	if err != nil {
		return report, err
	}
	if len(docs) == 0 {
		return report, errors.New("the stream holds no documents")
	}
	report.Documents = len(docs)
	for i, doc := range docs {
		where, problems := c.checkDocument(doc, &report)
		for _, p := range problems {
			report.Problems = append(report.Problems, fmt.Sprintf("document %d (%s): %s", i+1, where, p))
		}
	}
	return report, nil
}

// checkDocument checks one document, returning how to name it and its problems.
func (c *Checker) checkDocument(doc []byte, report *Report) (string, []string) {
	// YAMLToJSONStrict rejects duplicate keys, which a lenient parse would silently merge.
	data, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return "unparsed", []string{"not valid YAML: " + err.Error()}
	}
	var h header
	if err := json.Unmarshal(data, &h); err != nil {
		return "unparsed", []string{"not a Kubernetes object: " + err.Error()}
	}
	if h.APIVersion == "" || h.Kind == "" {
		return h.String(), []string{"apiVersion and kind are required"}
	}
	gv, err := schema.ParseGroupVersion(h.APIVersion)
	if err != nil {
		return h.String(), []string{"apiVersion: " + err.Error()}
	}
	gk := schema.GroupKind{Group: gv.Group, Kind: h.Kind}
	switch {
	case c.scheme.IsGroupRegistered(gv.Group):
		report.BuiltIn++
		return h.String(), c.checkBuiltin(data, gv)
	case c.custom[gk] != nil:
		report.Custom++
		return h.String(), c.custom[gk].check(data, gv.Version)
	case c.allowed[gk]:
		report.Allowed++
		return h.String(), nil
	}
	return h.String(), []string{fmt.Sprintf(
		"kind %q of group %q is neither a built-in type nor declared by a loaded CRD (give its CRD with -crds, or -allow %s/%s)",
		gk.Kind, gk.Group, gk.Group, gk.Kind)}
}

// checkBuiltin decodes a built-in object strictly, then validates it.
func (c *Checker) checkBuiltin(data []byte, gv schema.GroupVersion) []string {
	obj, _, err := c.decoder.Decode(data, nil, nil)
	if runtime.IsNotRegisteredError(err) {
		return []string{c.notRegistered(gv)}
	}
	var problems []string
	if strict, ok := runtime.AsStrictDecodingError(err); ok {
		// The object decoded; each unknown or duplicate field is its own problem.
		for _, e := range strict.Errors() {
			problems = append(problems, e.Error())
		}
	} else if err != nil {
		return []string{err.Error()}
	}
	for _, e := range validateBuiltin(obj) {
		problems = append(problems, e.Error())
	}
	return problems
}

// notRegistered explains an apiVersion/kind of a built-in group that the scheme does not know,
// listing what the group does serve so that a misspelling is easy to see.
func (c *Checker) notRegistered(gv schema.GroupVersion) string {
	var kinds []string
	for kind := range c.scheme.KnownTypes(gv) {
		if !strings.HasSuffix(kind, "List") && !strings.HasSuffix(kind, "Options") && kind != "WatchEvent" && kind != "Status" {
			kinds = append(kinds, kind)
		}
	}
	if len(kinds) == 0 {
		var versions []string
		for _, v := range c.scheme.PrioritizedVersionsForGroup(gv.Group) {
			versions = append(versions, v.String())
		}
		return fmt.Sprintf("apiVersion %q is not a served built-in version (the GA versions of group %q: %s)",
			gv.String(), gv.Group, strings.Join(versions, ", "))
	}
	sort.Strings(kinds)
	return fmt.Sprintf("kind is not a built-in kind of %s (known kinds: %s)", gv.String(), strings.Join(kinds, ", "))
}
