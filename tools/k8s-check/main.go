// Command k8s-check checks a multi-document Kubernetes YAML stream (the output of
// `kustomize build`) the way an API server with strict field validation would, without a
// cluster:
//
//   - every object of a built-in group is decoded strictly into its Go type from k8s.io/api
//     (unknown, misspelled or duplicate fields fail; a wrong type fails; an apiVersion/kind
//     the scheme does not know fails) and then run through a set of the API server's cheap
//     checks (metadata names and labels, selectors that match their templates, containers,
//     ports, probes, volumes, env, services, autoscalers, disruption budgets, policies);
//   - every object of a group that a CustomResourceDefinition given with -crds declares is
//     checked against that CRD's openAPIV3Schema with the API server's own code: unknown
//     fields are reported (structural pruning), then the schema validation, the list-type
//     checks and the CRD's CEL rules (x-kubernetes-validations) run;
//   - any other object fails, unless its group/kind is allowed with -allow (fail closed).
//
// It prints one line per problem, naming the document (1-based index in the stream), the
// object and the offending field, and exits 1 when there is any; 2 on a usage or read error.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }

func (s *stringList) Set(v string) error {
	*s = append(*s, v)
	return nil
}

func main() {
	var crdPaths, allowed stringList
	flag.Var(&crdPaths, "crds", "a CRD YAML file or a folder of them (repeatable)")
	flag.Var(&allowed, "allow", "GROUP/KIND accepted without a schema (repeatable)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: k8s-check [-crds PATH]... [-allow GROUP/KIND]... [FILE|-]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 1 {
		flag.Usage()
		os.Exit(2)
	}
	os.Exit(run(flag.Arg(0), crdPaths, allowed))
}

// run checks one stream and returns the exit status.
func run(input string, crdPaths, allowed []string) int {
	checker, err := NewChecker(crdPaths, allowed)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8s-check:", err)
		return 2
	}
	data, err := readInput(input)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8s-check:", err)
		return 2
	}
	report, err := checker.CheckStream(data)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8s-check:", err)
		return 2
	}
	for _, p := range report.Problems {
		fmt.Fprintln(os.Stderr, p)
	}
	fmt.Println(report.Summary())
	if len(report.Problems) > 0 {
		return 1
	}
	return 0
}

// readInput reads the named file, or standard input for "" and "-".
func readInput(name string) ([]byte, error) {
	if name == "" || name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}
