#!/usr/bin/env bash
# Creates a new ferrocx adaptor crate from this template.
#
#   plugin-sdk/template/new-adaptor.sh [--git | --local] NAME DEST
#
# NAME     the adaptor's name: lowercase ASCII letters, digits and '_', starting with a letter
#          (e.g. `acme`); the plugin builds to libferrocx_adaptor_NAME.so.
# DEST     a directory that does not exist yet (or is empty), e.g. ../ferrocx-adaptor-acme.
# --local  (the default) depend on this checkout's plugin-sdk/ and conformance/ by absolute
#          path: builds offline, and against exactly the SDK of this checkout.
# --git    depend on the release tag of this checkout (`v<version>` of the ferrocx repository)
#          instead: a crate that builds anywhere with network access, once that tag exists.
#
# It copies the template, puts NAME wherever the template says `myvendor`, and writes the
# dependencies on the SDK and the conformance kit.
set -euo pipefail

die() {
    echo "new-adaptor.sh: $*" >&2
    exit 2
}

local_deps=1
case "${1:-}" in
    --local) shift ;;
    --git)
        local_deps=0
        shift
        ;;
esac
[ $# -eq 2 ] || die "usage: new-adaptor.sh [--git | --local] NAME DEST"
name=$1
dest=$2

[[ $name =~ ^[a-z][a-z0-9_]*$ ]] ||
    die "NAME must be lowercase ASCII letters, digits and '_', starting with a letter (got '$name')"
[ ${#name} -le 48 ] || die "NAME is longer than 48 characters"
if [ -e "$dest" ]; then
    [ -d "$dest" ] || die "DEST '$dest' exists and is not a directory"
    [ -z "$(ls -A "$dest")" ] || die "DEST '$dest' exists and is not empty"
fi

template=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sdk=$(cd "$template/.." && pwd)
root=$(cd "$sdk/.." && pwd)
kit="$root/conformance"
# The release of this checkout: the workspace's version.
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\([^"]*\)"/\1/p' "$root/Cargo.toml")
[ -n "$version" ] || die "could not read the workspace version from $root/Cargo.toml"

mkdir -p "$dest/src" "$dest/tests"
cp "$template/Cargo.toml" "$template/README.md" "$template/.gitignore" "$dest/"
cp "$template/src/"*.rs "$dest/src/"
cp "$template/tests/"*.rs "$dest/tests/"

# Escapes a string for the replacement side of a sed `s|...|...|` command.
sed_escape() {
    printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'
}

# Rewrites a file through sed (portable: no `sed -i`).
rewrite() {
    local file=$1
    shift
    sed "$@" "$file" >"$file.new"
    mv "$file.new" "$file"
}

for f in "$dest/Cargo.toml" "$dest/README.md" "$dest"/src/*.rs "$dest"/tests/*.rs; do
    rewrite "$f" -e "s/myvendor/$name/g"
done
if [ $local_deps -eq 1 ]; then
    sdk_dep="{ path = \"$sdk\" }"
    kit_dep="{ path = \"$kit\" }"
else
    sdk_dep="{ git = \"https://github.com/ferrocx/ferrocx\", tag = \"v$version\" }"
    kit_dep=$sdk_dep
fi
rewrite "$dest/Cargo.toml" \
    -e "s|^ferrocx-plugin-sdk = .*|ferrocx-plugin-sdk = $(sed_escape "$sdk_dep")|" \
    -e "s|^ferrocx-conformance = .*|ferrocx-conformance = $(sed_escape "$kit_dep")|"
grep -qF "ferrocx-plugin-sdk = $sdk_dep" "$dest/Cargo.toml" ||
    die "could not set the SDK dependency in $dest/Cargo.toml"
grep -qF "ferrocx-conformance = $kit_dep" "$dest/Cargo.toml" ||
    die "could not set the conformance kit dependency in $dest/Cargo.toml"

cat <<DONE
Created the ferrocx adaptor "$name" in $dest (SDK: $sdk_dep).
Next:
  cd $dest
  cargo test                       # builds the plugin and runs the conformance kit on it
  cargo test -- --nocapture        # the same, printing the kit's report
Then implement the methods in src/ (grep -rn 'TODO(vendor' src/), removing each from the
absent lists in src/lib.rs as it is done (README.md: what first).
DONE
