#!/usr/bin/env bash
# shout: the text in capitals. Arguments as JSON on stdin, the result as JSON on stdout.
set -euo pipefail
jq '{text: (.text | ascii_upcase)}'
