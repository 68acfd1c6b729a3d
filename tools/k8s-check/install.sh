#!/usr/bin/env bash
# Installs what the strict manifest check (tests/k8s/test_k8s_strict.py) needs, idempotently,
# under ${PODIUM_CACHE:-~/.cache/podium}, and prints where it put them as two lines:
#   PODIUM_K8S_CHECK=<the checker binary>
#   PODIUM_STRIMZI_CRDS=<a folder of Strimzi's CustomResourceDefinitions>
#
# - The checker (this folder's Go program, on k8s.io/api and k8s.io/apiextensions-apiserver from
#   the Go module proxy) is rebuilt only when its sources change: the binary's name carries a
#   hash of go.mod, go.sum and the *.go files.
# - Strimzi publishes no CRD YAML to a package registry, but it does publish (Maven Central) the
#   annotated API model classes (io.strimzi:api) and the generator its own build runs over them
#   (io.strimzi:crd-generator). The CRDs are generated here with the arguments of Strimzi's own
#   build (api/pom.xml, execution generate-crd-co-install-v1), pinned by strimzi.version in
#   strimzi/pom.xml, once per version. Those classes need Java 21 or newer.
#
# Exit status: 0 installed (or already there); 3 a tool it needs (go, mvn, Java 21+) is missing;
# anything else: a build or generation failure.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${PODIUM_CACHE:-$HOME/.cache/podium}"

missing() {
  echo "k8s-check install: $1" >&2
  exit 3
}

# --- the checker ---------------------------------------------------------------------------
command -v go >/dev/null 2>&1 || missing "go is not installed"
sum="$(cd "$HERE" && cat go.mod go.sum $(ls *.go | LC_ALL=C sort) | sha256sum | cut -c1-16)"
checker="$CACHE/go-bin/k8s-check-$sum"
if [[ ! -x "$checker" ]]; then
  echo "k8s-check install: building the checker into $checker" >&2
  mkdir -p "$CACHE/go-bin"
  (cd "$HERE" && go build -mod=readonly -buildvcs=false -trimpath -o "$checker.tmp.$$" . >&2)
  mv -f "$checker.tmp.$$" "$checker"
  # The stable name points at the newest build, for running it by hand.
  ln -sfn "$(basename "$checker")" "$CACHE/go-bin/k8s-check"
  # Builds of older sources are left behind by the hash in the name; keep only this one.
  find "$CACHE/go-bin" -maxdepth 1 -name 'k8s-check-*' ! -name "$(basename "$checker")" \
    ! -name '*.tmp.*' -delete
fi

# --- Strimzi's CRDs ------------------------------------------------------------------------
version="$(sed -n 's:.*<strimzi.version>\(.*\)</strimzi.version>.*:\1:p' "$HERE/strimzi/pom.xml")"
[[ -n $version ]] || { echo "k8s-check install: no strimzi.version in strimzi/pom.xml" >&2; exit 1; }
crds="$CACHE/strimzi-crds/$version"
# Kind=file pairs as in Strimzi's api/pom.xml (the packaging/install/cluster-operator names).
model=io.strimzi.api.kafka.model
targets=(
  "$model.kafka.Kafka=040-Crd-kafka.yaml"
  "$model.connect.KafkaConnect=041-Crd-kafkaconnect.yaml"
  "$model.podset.StrimziPodSet=042-Crd-strimzipodset.yaml"
  "$model.topic.KafkaTopic=043-Crd-kafkatopic.yaml"
  "$model.user.KafkaUser=044-Crd-kafkauser.yaml"
  "$model.nodepool.KafkaNodePool=045-Crd-kafkanodepool.yaml"
  "$model.bridge.KafkaBridge=046-Crd-kafkabridge.yaml"
  "$model.connector.KafkaConnector=047-Crd-kafkaconnector.yaml"
  "$model.mirrormaker2.KafkaMirrorMaker2=048-Crd-kafkamirrormaker2.yaml"
  "$model.rebalance.KafkaRebalance=049-Crd-kafkarebalance.yaml"
)

# java21 prints a Java runtime of version 21 or newer: JAVA_HOME's, the one on PATH, or one
# under /usr/lib/jvm (where this project's machines keep a newer JDK beside the default 17).
java21() {
  local candidate major
  for candidate in ${JAVA_HOME:+"$JAVA_HOME/bin/java"} "$(command -v java || true)" /usr/lib/jvm/*/bin/java; do
    [[ -x $candidate ]] || continue
    major="$("$candidate" -XshowSettings:properties -version 2>&1 |
      sed -n 's/^ *java.specification.version = \([0-9]*\).*/\1/p')"
    if [[ -n $major && $major -ge 21 ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

if [[ ! -f "$crds/.complete" ]]; then
  command -v mvn >/dev/null 2>&1 || missing "mvn is not installed (it resolves Strimzi's generator)"
  java="$(java21)" || missing "no Java 21+ runtime (JAVA_HOME, PATH or /usr/lib/jvm) for Strimzi's generator"
  echo "k8s-check install: generating Strimzi $version CRDs into $crds" >&2
  work="$(mktemp -d "${TMPDIR:-/tmp}/strimzi-crds.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  # Maven's log is shown only when it fails (its quiet mode still prints colour codes).
  mvn -q -B -f "$HERE/strimzi/pom.xml" dependency:build-classpath \
    -Dmdep.outputFile="$work/classpath" >"$work/mvn.log" 2>&1 || { cat "$work/mvn.log" >&2; exit 1; }
  args=()
  for t in "${targets[@]}"; do args+=("${t%%=*}=$work/out/${t#*=}"); done
  mkdir -p "$work/out"
  "$java" -cp "$(cat "$work/classpath")" io.strimzi.crdgenerator.CrdGenerator \
    --label app:strimzi --label strimzi.io/crd-install:true --target-kube 1.16+ \
    --crd-api-version v1 --api-versions v1 --storage-version v1 --yaml "${args[@]}" >&2
  touch "$work/out/.complete"
  mkdir -p "$(dirname "$crds")"
  # Only a complete folder is ever moved in; a concurrent install may have won the race.
  mv -T "$work/out" "$crds" 2>/dev/null || [[ -f "$crds/.complete" ]]
fi

echo "PODIUM_K8S_CHECK=$checker"
echo "PODIUM_STRIMZI_CRDS=$crds"
