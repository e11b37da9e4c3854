#!/usr/bin/env bash
# Fails when a file of the repository cites something a clean clone does not have:
#   - a relative markdown link (or image) in a *.md file whose target file is missing, or whose
#     #anchor matches no heading of the target page;
#   - a `docs/...` path anywhere (code comments, scripts, docs) that does not exist, or whose #anchor or
#     following "§N.M" names a heading the page does not have;
#   - any other `*.md` mention (a bare NAME.md, or a path under one of the repository's own top-level
#     folders) that resolves neither from the citing file's folder nor from the repository root; names of
#     pages the tools generate (GENERATED below) and paths under other folders (run outputs) are skipped;
#   - a "§N" with no page named before it on the line, in code (which page?) or in a page that has no
#     such section;
#   - a path outside the repository (`../shared`, `/work/`).
# Usage: scripts/check_citations.sh [FILE...]   (default: every tracked or new, non-ignored text file)
# Prints one "file:line: problem" per finding and exits 1 if there is any.
set -uo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C.UTF-8
ROOT=$(pwd -P)
SELF=scripts/check_citations.sh
GENERATED='^(summary|report)\.md$'  # pages written into run folders, not kept in the repository

if (($#)); then
  FILES=("$@")
else
  mapfile -t FILES < <(git ls-files -co --exclude-standard 2>/dev/null |
    grep -E '(\.(md|h|hpp|cpp|cc|c|py|sh|txt|json|cmake)|^\.ci/run|CMakeLists\.txt)$' | grep -v '^build/' |
    grep -v '^tests/data/' | grep -v '^fuzz/corpus/' | sort -u)  # test fixtures and fuzz seeds: data (a tokenizer's vocabulary holds "§" as a byte symbol)
fi

TOPS=$(git ls-files 2>/dev/null | grep / | cut -d/ -f1 | sort -u | tr '\n' ' ')  # the repository's own folders
problems=0
report() { echo "$1:$2: $3"; problems=$((problems + 1)); }

# Lines outside ``` fences, as "lineno<TAB>text".
prose_lines() { awk '/^[[:space:]]*```/ { fence = !fence; next } !fence { print NR "\t" $0 }' "$1"; }

# GitHub's heading anchors of a markdown file, one per line: lower case, punctuation dropped, spaces to
# hyphens, "-1", "-2", ... for repeats.
declare -A SLUGS HEADS
load_page() {
  local f=$1
  [[ -n ${HEADS[$f]+x} ]] && return
  HEADS[$f]=$(prose_lines "$f" | cut -f2- | grep -E '^#{1,6}[[:space:]]' | sed -E 's/^#+[[:space:]]+//; s/[[:space:]]+#+[[:space:]]*$//; s/[[:space:]]+$//')
  SLUGS[$f]=$(printf '%s\n' "${HEADS[$f]}" | sed 's/.*/\L&/' | sed -E 's/[^[:alnum:] _-]//g; s/ /-/g' |
    awk 'NF { n = seen[$0]++; print (n ? $0 "-" n : $0) }')
}
has_anchor() { load_page "$1"; grep -qxF -- "$2" <<<"${SLUGS[$1]}"; }
# A heading whose text starts with the section number: "3.2 ..." or "3. ...".
has_section() {
  load_page "$1"
  local re=${2//./\\.}
  grep -qE "^${re}(\.|[[:space:]]|$)" <<<"${HEADS[$1]}"
}

# Resolves a cited path: relative to the citing file's folder first, then to the repository root.
# Sets REPLY to the repository-relative path, or to "" when it does not exist inside the repository.
declare -A RESOLVED
resolve() {
  local key="$1|$2" c
  if [[ -z ${RESOLVED[$key]+x} ]]; then
    RESOLVED[$key]=""
    for c in "$1/$2" "$2"; do
      [[ -e $c ]] || continue
      c=$(realpath -m --relative-to="$ROOT" "$c")
      [[ $c == ..* || $c == /* ]] && continue
      RESOLVED[$key]=$c
      break
    done
  fi
  REPLY=${RESOLVED[$key]}
}

check_section_refs() {  # file line text page: every "§N" in text refers to page
  local f=$1 n=$2 text=$3 page=$4 sec
  while read -r sec; do
    [[ -z $sec ]] && continue
    has_section "$page" "$sec" || report "$f" "$n" "§$sec: $page has no section $sec"
  done < <(grep -oE '§[0-9]+(\.[0-9]+)*' <<<"$text" | sed 's/^§//')
}

for f in "${FILES[@]}"; do
  [[ -f $f && $f != "$SELF" ]] || continue
  grep -Iq . "$f" 2>/dev/null || continue  # binary or empty
  dir=.; [[ $f == */* ]] && dir=${f%/*}
  is_md=0; [[ $f == *.md ]] && is_md=1

  while IFS=: read -r n _; do
    report "$f" "$n" "cites a path outside the repository (../shared or /work/)"
  done < <(grep -nE '\.\./shared|(^|[^A-Za-z0-9_.])/work/' "$f")

  if ((is_md)); then
    # Relative links and images.
    while IFS=$'\t' read -r n text; do
      while read -r target; do
        target=${target#](}; target=${target%)}
        target=${target%% *}
        [[ -z $target || $target =~ ^[a-z]+: ]] && continue
        path=${target%%#*}; anchor=""; [[ $target == *#* ]] && anchor=${target#*#}
        if [[ -z $path ]]; then page=$f
        else
          resolve "$dir" "$path"; page=$REPLY
          if [[ -z $page ]]; then report "$f" "$n" "link to a missing file: $target"; continue; fi
        fi
        if [[ -n $anchor && $page == *.md ]] && ! has_anchor "$page" "$anchor"; then
          report "$f" "$n" "link to a missing heading: $target"
        fi
      done < <(grep -oE '\]\([^)]*\)' <<<"$text")
    done < <(prose_lines "$f" | grep -F '](')
  fi

  # Path and section mentions, line by line (URLs removed first).
  while IFS=$'\t' read -r n text; do
    while [[ $text =~ [a-zA-Z]+://[^\ \)\>\`\"]* ]]; do text=${text/"${BASH_REMATCH[0]}"/}; done
    last_page=""
    # Tokens: docs/... paths (with an optional #anchor) and NAME.md names, in order of appearance, each
    # followed by what comes after it on the line up to the next token.
    rest=$text
    while [[ $rest =~ (^|[^A-Za-z0-9_./-])((docs/[A-Za-z0-9_.-]*[A-Za-z0-9_-](/[A-Za-z0-9_.-]*[A-Za-z0-9_-])*|[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md)(#[A-Za-z0-9_-]+)?) ]]; do
      match=${BASH_REMATCH[0]} lead=${BASH_REMATCH[1]} token=${BASH_REMATCH[2]}
      before=${rest%%"$match"*}
      # Sections cited before this token belong to the previous page (or to this file).
      if [[ -n $last_page ]]; then check_section_refs "$f" "$n" "$before" "$last_page"
      elif [[ $before == *§* ]]; then
        if ((is_md)); then check_section_refs "$f" "$n" "$before" "$f"
        else report "$f" "$n" "a § citation without the page it refers to (write docs/PAGE.md §N)"; fi
      fi
      rest=${rest#*"$match"}
      path=${token%%#*}; anchor=""; [[ $token == *#* ]] && anchor=${token#*#}
      if [[ $path == */* ]]; then
        [[ -n ${path%%/*} && " $TOPS " == *" ${path%%/*} "* ]] || { last_page=""; continue; }
      elif [[ $path =~ $GENERATED ]]; then
        last_page=""; continue
      fi
      if [[ $path == docs/* ]]; then resolve . "$path"; else resolve "$dir" "$path"; fi
      page=$REPLY
      in_link=0; [[ $lead == "(" && $before == *"]" ]] && in_link=1  # reported by the link check
      if [[ -z $page ]]; then
        ((in_link)) || report "$f" "$n" "cites a file that is not in the repository: $path"
        last_page=""
        continue
      fi
      if ((!in_link)) && [[ -n $anchor && $page == *.md ]] && ! has_anchor "$page" "$anchor"; then
        report "$f" "$n" "cites a missing heading: $token"
      fi
      last_page=""; [[ $page == *.md ]] && last_page=$page
    done
    if [[ -n $last_page ]]; then check_section_refs "$f" "$n" "$rest" "$last_page"
    elif [[ $rest == *§* ]]; then
      if ((is_md)); then check_section_refs "$f" "$n" "$rest" "$f"
      else report "$f" "$n" "a § citation without the page it refers to (write docs/PAGE.md §N)"; fi
    fi
  done < <(if ((is_md)); then prose_lines "$f"; else grep -nE 'docs/|\.md|§' "$f" | sed 's/:/\t/'; fi |
    grep -E 'docs/|\.md|§')
done

if ((problems)); then
  echo "check_citations: $problems citation(s) that a clean clone cannot resolve"
  exit 1
fi
echo "check_citations: ${#FILES[@]} files, every citation resolves"
