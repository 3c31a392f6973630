#!/usr/bin/env bash
# Creates a new ferrocx adaptor crate from this template.
#
#   plugin-sdk/template/new-adaptor.sh NAME DEST
#
# NAME  the adaptor's name: lowercase ASCII letters, digits and '_', starting with a letter
#       (e.g. `acme`); the plugin builds to libferrocx_adaptor_NAME.so.
# DEST  a directory that does not exist yet (or is empty), e.g. ../ferrocx-adaptor-acme.
#
# It copies the template, puts NAME wherever the template says `myvendor`, and points the
# ferrocx-plugin-sdk dependency at this checkout's plugin-sdk/ (an absolute path).
set -euo pipefail

die() {
    echo "new-adaptor.sh: $*" >&2
    exit 2
}

[ $# -eq 2 ] || die "usage: new-adaptor.sh NAME DEST"
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

mkdir -p "$dest/src"
cp "$template/Cargo.toml" "$template/README.md" "$template/.gitignore" "$dest/"
cp "$template/src/"*.rs "$dest/src/"

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

for f in "$dest/Cargo.toml" "$dest/README.md" "$dest"/src/*.rs; do
    rewrite "$f" -e "s/myvendor/$name/g"
done
rewrite "$dest/Cargo.toml" \
    -e "s|^ferrocx-plugin-sdk = { path = \"[^\"]*\" }|ferrocx-plugin-sdk = { path = \"$(sed_escape "$sdk")\" }|"
grep -qF "ferrocx-plugin-sdk = { path = \"$sdk\" }" "$dest/Cargo.toml" ||
    die "could not set the SDK path in $dest/Cargo.toml"

cat <<DONE
Created the ferrocx adaptor "$name" in $dest.
Next:
  cd $dest
  cargo build --release            # -> target/release/libferrocx_adaptor_$name.so
  FERROCX_PLUGIN_PATH=target/release ferrocx info
  ferrocx conformance --plugin target/release/libferrocx_adaptor_$name.so
Then fill in the TODO(vendor) messages: grep -rn 'TODO(vendor)' $dest/src  (README.md: what first)
DONE
