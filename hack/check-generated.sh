#!/usr/bin/env bash
# hack/check-generated.sh DIR...: fails when the Go generated from proto/ (make generate's templates) is not
# what the tree holds in DIR...: a generated file that differs from the committed one or is not committed,
# or a committed .pb.go that nothing generates any more. It generates into a temporary directory and
# changes nothing in the tree. Called by make check-generated, which passes BUF (a command line that may
# start with variable assignments, as env takes them).
set -euo pipefail
: "${BUF:?}"
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086 # BUF is a command line, split into its words
env $BUF generate -o "$tmp"
# shellcheck disable=SC2086
env $BUF generate --template buf.gen.agent.yaml -o "$tmp"
bad=0
while IFS= read -r f; do
	if ! git ls-files --error-unmatch -- "$f" >/dev/null 2>&1; then
		echo "$f: generated, not committed (make generate, then commit it)"
		bad=1
	elif ! cmp -s "$tmp/$f" "$f"; then
		diff -u "$f" "$tmp/$f" || true
		echo "$f: differs from what make generate makes (make generate, then commit it)"
		bad=1
	fi
done < <(cd "$tmp" && find . -type f -printf '%P\n' | sort)
while IFS= read -r f; do
	if [ ! -e "$tmp/$f" ]; then
		echo "$f: committed, but nothing generates it any more (remove it)"
		bad=1
	fi
done < <(git ls-files -- "${@/%//*.pb.go}")
if [ "$bad" = 1 ]; then
	exit 1
fi
echo "generated code matches proto/ ($(cd "$tmp" && find . -type f | wc -l) files)"
