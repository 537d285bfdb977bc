#!/usr/bin/env bash
# word_count in Bash (with jq): arguments as JSON on stdin, the result as JSON on stdout.
set -euo pipefail
text=$(jq -r '.text')
if [[ -z "${text//[[:space:]]/}" ]]; then
  echo '{"error": {"code": "INVALID_ARGUMENTS", "message": "text is empty", "hint": "Pass the text to count."}}'
  exit 1
fi
words=$(printf '%s' "$text" | wc -w)
newlines=$(printf '%s' "$text" | tr -cd '\n' | wc -c)
lines=$((newlines + 1))  # $(...) drops a final newline, so the last line always counts once
jq -n --argjson w "$words" --argjson l "$lines" '{words: $w, lines: $l, language: "bash"}'
