#!/usr/bin/env bash
# scripts/perf-doc.sh on a temporary doc (make test): the splice is exact (the block becomes the
# report less its title and outer blank lines, byte for byte; nothing outside it changes; a
# second splice changes nothing), a report without a stamp line or a doc without its markers is
# refused with the doc left as it was, --check finds malformed blocks, and docs/PERFORMANCE.md's
# own blocks are well formed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PERF_DOC_SH="$ROOT/scripts/perf-doc.sh"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "perf-doc-test: FAIL: $*" >&2; fails=$((fails + 1)); }
splice() { PERF_DOC="$T/doc.md" bash "$PERF_DOC_SH" "$@" 2>"$T/err"; }

stamp=$(bash "$PERF_DOC_SH" stamp)
grep -qE '^- Commit: `[0-9a-f]{7,}(-dirty)?` · Machine: .+, [0-9]+ CPUs$' <<<"$stamp" || fail "stamp line: $stamp"

before='# Doc

Text before, with a `<!-- bench: x -->` mention inside a line (not a marker).
'
between='
## Between

'
after='
Text after.'
printf '%s\n<!-- bench: a -->\n- Commit: `0000000` · Machine: old, 1 CPUs\nold a\n<!-- /bench: a -->\n%s<!-- bench: b -->\n- Commit: `1111111` · Machine: old, 1 CPUs\n<!-- /bench: b -->\n%s\n' \
  "$before" "$between" "$after" >"$T/doc.md"
cp "$T/doc.md" "$T/original.md"
# A report as the benches write it: a title, blank lines, the stamp, tables, trailing blanks;
# lines the splice must copy as they are (a backslash, &, trailing spaces).
printf '# make something\n\n\n%s\n- Settings: A=1 B="x y"\n\n| case | value |\n|---|---:|\n| a \\& b | 1.00 |\nend with spaces   \n\n\n' \
  "$stamp" >"$T/report.md"
expected_body=$(printf '%s\n- Settings: A=1 B="x y"\n\n| case | value |\n|---|---:|\n| a \\& b | 1.00 |\nend with spaces   ' "$stamp")

if ! splice "a=$T/report.md"; then
  fail "splice a: $(cat "$T/err")"
else
  {
    printf '%s\n<!-- bench: a -->\n%s\n<!-- /bench: a -->\n%s<!-- bench: b -->\n- Commit: `1111111` · Machine: old, 1 CPUs\n<!-- /bench: b -->\n%s\n' \
      "$before" "$expected_body" "$between" "$after"
  } >"$T/expected.md"
  cmp -s "$T/doc.md" "$T/expected.md" || { fail "splice a is not exact:"; diff "$T/expected.md" "$T/doc.md" >&2 || true; }
  cp "$T/doc.md" "$T/once.md"
  splice "a=$T/report.md" || fail "second splice a: $(cat "$T/err")"
  cmp -s "$T/doc.md" "$T/once.md" || fail "a second splice of the same report changed the doc"
fi

# Refusals leave the doc as it was.
cp "$T/doc.md" "$T/kept.md"
printf '# r\n\n| no | stamp |\n' >"$T/nostamp.md"
splice "b=$T/nostamp.md" && fail "a report without a stamp line was spliced"
grep -q "no stamp line" "$T/err" || fail "no-stamp refusal says: $(cat "$T/err")"
splice "c=$T/report.md" && fail "a block without markers was spliced"
splice "a=$T/missing.md" && fail "a missing report was spliced"
printf '<!-- /bench: d -->\n<!-- bench: d -->\n- Commit: `2222222` · Machine: m, 2 CPUs\n' >>"$T/doc.md"
cp "$T/doc.md" "$T/kept.md"
splice "d=$T/report.md" && fail "a block closed before it opens was spliced"
cmp -s "$T/doc.md" "$T/kept.md" || fail "a refused splice changed the doc"

# --check
check() { printf "$1" >"$T/c.md"; PERF_DOC="$T/c.md" bash "$PERF_DOC_SH" --check 2>"$T/err"; }
ok='<!-- bench: a -->\n- Commit: `abcdef0-dirty` · Machine: Intel(R) Xeon(R), 2 CPUs\n<!-- /bench: a -->\n'
check "$ok" || fail "--check refused a good block: $(cat "$T/err")"
check '<!-- bench: a -->\n- Commit: `abcdef0`\n<!-- /bench: a -->\n' && fail "--check passed a block without a machine"
check '<!-- bench: a -->\n- Commit: `abcdef0` · Machine: m, 2 CPUs\n' && fail "--check passed an unclosed block"
check "$ok$ok" && fail "--check passed a name used twice"
check '<!-- bench: a -->\n<!-- bench: b -->\n- Commit: `abcdef0` · Machine: m, 2 CPUs\n<!-- /bench: b -->\n<!-- /bench: a -->\n' &&
  fail "--check passed nested blocks"
check '<!-- bench:a -->\n' && fail "--check passed a malformed marker"
check 'no blocks\n' && fail "--check passed a doc without blocks"
bash "$PERF_DOC_SH" --check || fail "docs/PERFORMANCE.md: --check"

[ "$fails" = 0 ] || exit 1
echo "perf-doc-test: ok"
