#!/usr/bin/env python3
"""word_count in Python: arguments as JSON on stdin, the result as JSON on stdout."""
import json
import sys

args = json.load(sys.stdin)
text = args["text"]
if not text.strip():
    print(json.dumps({"error": {"code": "INVALID_ARGUMENTS", "message": "text is empty",
                                "hint": "Pass the text to count."}}))
    sys.exit(1)
lines = text.count("\n") + (0 if text.endswith("\n") else 1)
print(json.dumps({"words": len(text.split()), "lines": lines, "language": "python"}))
