# shellcheck shell=bash
# Finds this machine's own Debian archive URI in its apt sources, so scripts that fetch from
# other suites (sid's source packages, a sid chroot) reach the same archive (mirror, proxy or
# snapshot) apt already uses, and the project names no archive host itself.
#
# Sourced by scripts/install-criu.sh and scripts/build-apiserver.sh:
#   . "$(dirname "$0")/lib/debian-archive.sh"
#   read -r uri signed_by <<<"$(debian_archive_uri)"   # tab-separated; signed_by may be empty
# Returns non-zero (and prints nothing) when no enabled `deb` source is found.

# Prints "URI<TAB>SUITES<TAB>SIGNED-BY" for each enabled binary (`deb`) source, reading both the
# deb822 `*.sources` and the one-line `sources.list` formats.
list_sources() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk -v OFS='\t' '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && uris != "" && enabled != "no") {
          split(uris, u, " "); print u[1], suites, signed
        }
        types = uris = suites = signed = enabled = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]/ { next }                          # continuation line (e.g. an inline key)
      {
        key = tolower($0); sub(/:.*/, "", key)
        val = $0; sub(/^[^:]*:[ \t]*/, "", val); sub(/[ \t]+$/, "", val)
        if (key == "types") types = val
        else if (key == "uris") uris = val
        else if (key == "suites") suites = val
        else if (key == "enabled") enabled = tolower(val)
        else if (key == "signed-by" && val ~ /^\//) signed = val
      }
      END { flush() }
    ' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    awk -v OFS='\t' '
      $1 != "deb" { next }
      {
        i = 2; signed = ""
        if ($2 ~ /^\[/) {
          for (; i <= NF; i++) {
            if ($i ~ /^\[?signed-by=/) { s = $i; sub(/^\[?signed-by=/, "", s); sub(/\]$/, "", s); signed = s }
            if ($i ~ /\]$/) { i++; break }
          }
        }
        print $i, $(i + 1), signed
      }
    ' "$f"
  done
}

# Prints "URI<TAB>SIGNED-BY" of the source serving this release's own suite
# (VERSION_CODENAME in /etc/os-release), else of the first non-security source.
debian_archive_uri() {
  local codename="" best="" fallback="" uri suites signed s
  # shellcheck disable=SC1091
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  while IFS=$'\t' read -r uri suites signed; do
    for s in $suites; do
      if [[ -n $codename && $s == "$codename" ]]; then best="$uri"$'\t'"$signed"; break 2; fi
    done
    if [[ -z $fallback && $suites != *-security* ]]; then fallback="$uri"$'\t'"$signed"; fi
  done < <(list_sources)
  [[ -n ${best:-$fallback} ]] || return 1
  printf '%s\n' "${best:-$fallback}"
}
