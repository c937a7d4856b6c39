#!/usr/bin/env bash
# Lines of code of the controllers compared in docs/controllers.md
# (configmap-hash and website): kinformer's examples and their kube-runtime
# and controller-runtime peers. Every file written by hand counts; code
# controller-gen generates (zz_generated.deepcopy.go, applyconfiguration/)
# does not. A line counts when, after the formatter (rustfmt,
# gofmt), it is neither blank nor only a comment (`//`, `//!`, `///`); a
# line with code and a trailing comment counts, except one whose comment
# is `bench knob`: a setting only the benchmark needs (controller-runtime's
# EnableWarmup and workers, for its extra failover and converge rows), which
# a user of that peer would not write; nor does one whose comment is
# `variant switch`: the lines that pick one of a program's two ways of
# writing its children (typed k8s-openapi structs in children.rs, `json!` in
# children_json.rs), which a program written one way would not have. Each Rust
# website is counted both ways. `imports` are the `use`
# declarations (Rust) or the import block (Go), shown apart because Go's
# import block is one package a line.
#
# Run from anywhere: bash bench/peers/count-lines.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"

count() { # count LABEL FILE...
    awk -v label="$1" -v file="${2#"$root"/}" '
        { line = $0; sub(/^[ \t]+/, "", line); sub(/[ \t]+$/, "", line) }
        line == "" || line ~ /^\/\// || line ~ /\/\/ (bench knob|variant switch)$/ { next }
        { code++ }
        # Rust: `use ...;`, possibly over several lines.
        in_use || line ~ /^(pub )?use / { imports++; in_use = (line !~ /;$/); next }
        # Go: `import (` ... `)` or a one-line `import "x"`.
        in_import { imports++; if (line == ")") in_import = 0; next }
        line ~ /^import \(/ { imports++; in_import = 1; next }
        line ~ /^import / { imports++; next }
        END { printf "%-26s %5d %8d %14d  %s\n", label, code, imports, code - imports, file }
    ' "${@:2}"
}

printf "%-26s %5s %8s %14s  %s\n" "controller" "lines" "imports" "without them" "file"
count kinformer "$root/examples/configmap-hash/src/main.rs"
count kube-runtime "$root/bench/peers/configmap-hash-kube-runtime/src/main.rs"
count controller-runtime "$root/bench/peers/configmap-hash-controller-runtime/main.go"
for program in kinformer:examples/website kube-runtime:bench/peers/website-kube-runtime; do
    src="$root/${program#*:}/src"
    count "${program%%:*} (typed)" "$src/main.rs" "$src/children.rs"
    count "${program%%:*} (json!)" "$src/main.rs" "$src/children_json.rs"
done
cr="$root/bench/peers/website-controller-runtime"
count controller-runtime "$cr/main.go" "$cr/webhook.go" \
    "$cr/api/v1/groupversion_info.go" "$cr/api/v1/website_types.go" "$cr/api/v1/website_conversion.go" \
    "$cr/api/v2/groupversion_info.go" "$cr/api/v2/website_types.go" "$cr/api/v2/website_conversion.go"
