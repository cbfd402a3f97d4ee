#!/usr/bin/env bash
# docs/PERFORMANCE.md's tables are copies of the benchmarks' reports, each between two markers:
#
#   <!-- bench: NAME -->
#   (the report)
#   <!-- /bench: NAME -->
#
#   bash scripts/perf-doc.sh                 splice every report below that exists (make perf-doc)
#   bash scripts/perf-doc.sh NAME=FILE ...   splice these reports
#   bash scripts/perf-doc.sh --check         the doc's blocks are well formed (make lint)
#   bash scripts/perf-doc.sh stamp           the stamp line every report carries
#
# Reports (paths from the repository's root): server=target/bench-report.md (make bench),
# service=target/bench-service/report.md (make bench-service), service-connection=
# target/bench-service/connection.md (make bench-service's TLS and failover rows),
# service-instructions=target/bench-service/instructions.md (BENCH_ONLY=edge-instructions
# make bench-service: Envoy's instructions per request under callgrind),
# profile=target/profile/profile.md (make profile), client=target/bench-client/report.md,
# cold=target/bench-cold.md and warm=target/bench-warm.md (make bench).
# PERF_DOC names another doc.
#
# The splice is exact: the lines between the markers become the report's lines, less its title
# (a first line starting with `#`: the doc has its own headings) and the blank lines at its
# start and end; nothing outside the markers changes. A report must carry the stamp line (the
# commit and the machine it was measured on), or it is refused and the doc left as it was.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

DOC=${PERF_DOC:-$ROOT/docs/PERFORMANCE.md}
DEFAULT_REPORTS=(
  server=$ROOT/target/bench-report.md
  service=$ROOT/target/bench-service/report.md
  service-connection=$ROOT/target/bench-service/connection.md
  service-instructions=$ROOT/target/bench-service/instructions.md
  profile=$ROOT/target/profile/profile.md
  client=$ROOT/target/bench-client/report.md
  cold=$ROOT/target/bench-cold.md
  warm=$ROOT/target/bench-warm.md
)
# "- Commit: `<short sha>[-dirty]` · Machine: <CPU model>, <n> CPUs" (no interval expressions:
# mawk has none)
STAMP_RE='^- Commit: `[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]+(-dirty)?` · Machine: .+, [0-9]+ CPUs$'
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

die() { echo "perf-doc: $*" >&2; exit 1; }

# The commit of this checkout (`-dirty` when tracked files differ from it) and the machine
# (/proc/cpuinfo's model name and its number of logical CPUs).
stamp() {
  local rev dirty="" model cpus
  rev=$(git -C "$ROOT" rev-parse --short HEAD)
  [ -z "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ] || dirty=-dirty
  model=$(awk -F': *' '$1 ~ /^model name/ { print $2; exit }' /proc/cpuinfo)
  cpus=$(grep -c '^processor' /proc/cpuinfo)
  printf -- '- Commit: `%s%s` · Machine: %s, %s CPUs\n' "$rev" "$dirty" "${model:-unknown CPU}" "$cpus"
}

# The doc's blocks: each `<!-- bench: NAME -->` closed by its `<!-- /bench: NAME -->` before any
# other marker, every name once, a stamp line inside every block.
check() {
  local doc=$1
  awk -v re="$STAMP_RE" '
    function fail(msg) { printf "perf-doc: %s:%d: %s\n", FILENAME, FNR, msg > "/dev/stderr"; bad = 1 }
    /^<!-- bench: [a-z0-9-]+ -->$/ {
      name = $3
      if (current != "") fail("block " current " is not closed before " name " opens")
      if (name in seen) fail("block " name " appears twice")
      seen[name] = 1; current = name; stamped = 0; blocks++; next
    }
    /^<!-- \/bench: [a-z0-9-]+ -->$/ {
      name = $3
      if (current != name) fail("closing " name " without its opening marker")
      else if (!stamped) fail("block " name " has no stamp line (bash scripts/perf-doc.sh stamp)")
      current = ""; next
    }
    /^[ \t]*<!-- *\/?bench/ { fail("malformed marker: " $0) }
    current != "" && $0 ~ re { stamped = 1 }
    END {
      if (current != "") fail("block " current " is never closed")
      if (!blocks) fail("no bench blocks")
      exit bad
    }' "$doc"
}

# The report's lines as the doc holds them: without its title, leading and trailing blank lines.
body_of() {
  awk 'FNR == 1 && /^#/ { next } { line[++n] = $0 }
    END {
      s = 1; while (s <= n && line[s] ~ /^[ \t]*$/) s++
      e = n; while (e >= s && line[e] ~ /^[ \t]*$/) e--
      for (i = s; i <= e; i++) print line[i]
    }' "$1"
}

splice() {
  local doc=$1 name=$2 report=$3 body=$WORK/body out=$WORK/out opens closes
  [ -f "$report" ] || die "$name: no report at $report"
  [[ $name =~ ^[a-z0-9-]+$ ]] || die "$name: a block name is lowercase letters, digits and -"
  opens=$(grep -cxF "<!-- bench: $name -->" "$doc" || true)
  closes=$(grep -cxF "<!-- /bench: $name -->" "$doc" || true)
  [ "$opens" = 1 ] && [ "$closes" = 1 ] ||
    die "$name: $doc needs one '<!-- bench: $name -->' and one '<!-- /bench: $name -->' (found $opens and $closes)"
  body_of "$report" >"$body"
  grep -qE "$STAMP_RE" "$body" || die "$name: $report has no stamp line ('- Commit: \`<sha>\` · Machine: <CPU>, <n> CPUs')"
  awk -v first="<!-- bench: $name -->" -v last="<!-- /bench: $name -->" -v body="$body" '
    $0 == last { inside = 0; if (!opened) exit 1 }
    inside { next }
    { print }
    $0 == first { while ((getline l < body) > 0) print l; inside = 1; opened = 1 }
    END { if (inside) exit 1 }' "$doc" >"$out" || die "$name: '<!-- /bench: $name -->' must follow its opening marker"
  cat "$out" >"$doc"
  echo "perf-doc: $name <- $report" >&2
}

case "${1:-}" in
  stamp) stamp ;;
  --check) check "$DOC" ;;
  "")
    for pair in "${DEFAULT_REPORTS[@]}"; do
      if [ -f "${pair#*=}" ]; then splice "$DOC" "${pair%%=*}" "${pair#*=}"; else echo "perf-doc: ${pair%%=*}: no ${pair#*=}, kept" >&2; fi
    done
    check "$DOC" ;;
  *)
    for pair in "$@"; do
      [[ $pair == *=* ]] || die "expected NAME=FILE, got '$pair'"
      splice "$DOC" "${pair%%=*}" "${pair#*=}"
    done
    check "$DOC" ;;
esac
